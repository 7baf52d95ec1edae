"""The constructor options: fused_amp's own, declared once, and torch's checks of its own."""
import torch

from fused_amp.optim import _quantize

# The keyword-only options every optimizer of fused_amp.optim takes beyond torch's, with their
# defaults. Each class spells them out in its signature (as torch's do, for IDEs and
# inspect.signature); tests/test_dropin.py checks every signature against this table.
FUSED_AMP_OPTIONS = {
    "master_weights": True,
    "unscale_grads": True,
    "max_grad_norm": None,
    "grad_norm_type": 2.0,
    "state_dtype": torch.float32,
    "stochastic_rounding": None,
    "rounding_seed": None,
    "min_8bit_size": _quantize.MIN_8BIT_SIZE,
}


def group_options(args: dict) -> dict:
    """A constructor's arguments (its ``locals()`` on entry) as the group options torch keeps:
    all but ``self``, ``params`` and the ``__class__`` cell of ``super()``."""
    return {k: v for k, v in args.items() if k not in ("self", "params", "__class__")}


def check_lr(lr):
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")


def check_betas(betas):
    for i in (0, 1):
        if not 0.0 <= betas[i] < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {betas[i]}")


def check_eps(eps):
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")


def check_weight_decay(weight_decay):
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def check_torch_flags(name: str, foreach, fused, differentiable):
    """torch's ``foreach``/``fused``/``capturable`` are accepted (the step is always fused and
    capturable); what cannot apply is refused with torch's errors, or a clear one."""
    if differentiable:
        raise RuntimeError(f"{name}: differentiable=True is not supported: the fused step updates "
                           "the params in place, outside autograd")
    if fused and foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
