"""The constructor options: fused_amp's own, declared once, and torch's checks of its own."""
import inspect
from typing import Optional, Union

import torch

from fused_amp.optim import _quantize

# The keyword-only options every optimizer of fused_amp.optim takes beyond torch's: name ->
# (default, annotation). A class's __init__ takes them as **options; its signature (for
# inspect.signature, the docs and IDEs) gets them from here (Declared.__init_subclass__).
FUSED_AMP_OPTIONS = {
    "master_weights": (True, Union[bool, str]),
    "unscale_grads": (True, bool),
    "max_grad_norm": (None, Optional[float]),
    "grad_norm_type": (2.0, float),
    "state_dtype": (torch.float32, torch.dtype),
    "stochastic_rounding": (None, Optional[bool]),
    "rounding_seed": (None, Optional[int]),
    "min_8bit_size": (_quantize.MIN_8BIT_SIZE, int),
    "float8_scales": (None, Optional[bool]),
}


def group_options(args: dict) -> dict:
    """A constructor's arguments (its ``locals()`` on entry) as the group options torch keeps:
    its own but ``self`` and ``params`` (and the ``__class__`` cell of ``super()``), then each of
    FUSED_AMP_OPTIONS, from ``**options`` or its default. Another keyword is refused as Python
    refuses it."""
    options = args.get("options", {})
    for key in options:
        if key not in FUSED_AMP_OPTIONS:
            raise TypeError(f"{type(args['self']).__name__}.__init__() got an unexpected keyword argument {key!r}")
    named = {k: v for k, v in args.items() if k not in ("self", "params", "__class__", "options")}
    return dict(named, **{k: options.get(k, default) for k, (default, _) in FUSED_AMP_OPTIONS.items()})


def takes_our_options(init) -> bool:
    """Whether ``init`` takes fused_amp's options as ``**options`` (ours do; a user's subclass
    with a signature of its own keeps it)."""
    params = inspect.signature(init).parameters
    return ("options" in params and params["options"].kind == inspect.Parameter.VAR_KEYWORD
            and not FUSED_AMP_OPTIONS.keys() & params.keys())


def with_our_options(init) -> inspect.Signature:
    """The signature of an ``__init__(self, ..., **options)``: its own parameters, then
    FUSED_AMP_OPTIONS as keyword-only ones with their defaults."""
    own = [p for p in inspect.signature(init).parameters.values() if p.kind != p.VAR_KEYWORD]
    ours = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
            for k, (default, annotation) in FUSED_AMP_OPTIONS.items()]
    return inspect.Signature(own + ours)


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


def check_in_order(options, *keys):
    """torch's checks of ``keys`` (``lr``, ``eps``, ``betas``, ``weight_decay``), in the order
    the optimizer's torch class runs them, with its messages."""
    for key in keys:
        _CHECKS[key](options[key])


_CHECKS = {"lr": check_lr, "eps": check_eps, "betas": check_betas, "weight_decay": check_weight_decay}


def check_torch_flags(name: str, foreach, fused, differentiable):
    """torch's ``foreach``/``fused``/``capturable`` are accepted (the step is always fused and
    capturable); what cannot apply is refused with torch's errors, or a clear one."""
    if differentiable:
        raise RuntimeError(f"{name}: differentiable=True is not supported: the fused step updates "
                           "the params in place, outside autograd")
    if fused and foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
