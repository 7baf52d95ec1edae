"""The constructor options: fused_amp's own, declared once, and torch's checks of its own."""
import inspect
import textwrap
from typing import Optional, Union

import torch

from fused_amp.optim import _quantize

# The keyword-only options every optimizer of fused_amp.optim takes beyond torch's: name ->
# (default, annotation). A class's __init__ takes them as **options; its signature (for
# inspect.signature, the docs and IDEs) gets them from here (_declared.declare).
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


# What each of FUSED_AMP_OPTIONS does, written once and put into every optimizer's docstring
# where it says {fused_amp_options} (as torch puts its _maximize_doc into each of its own):
# ``options_doc``. {states}, {maps} and {rounding_default} are the optimizer's own.
_OPTION_DOCS = {
    "master_weights": r"""master_weights (bool or str): keep fp32 masters for fp16/bf16 params (default: True,
    also ``"fp32"``). ``"remainder"`` (bf16 params only) keeps the same master exactly
    in 2 bytes per param instead of 4: the param is its high half (rounded to nearest,
    ties away from zero, where True rounds ties to even) and an int16 remainder its low
    half. ``"remainder8"`` (bf16 params only) keeps a 24-bit master (sign, exponent and
    15 mantissa bits: an fp32 value with its low 8 bits zero) in 1 byte per param
    (``state["master_remainder8"]``, the master's bits 8-15; the param is its high half,
    as with ``"remainder"``); each step's fp32 result is rounded to 24 bits as
    ``stochastic_rounding`` says. With False, half params are updated in place (fp32
    math, rounded each step).""",
    "state_dtype": r"""state_dtype (torch.dtype): dtype of {states}: torch.float32 (default),
    torch.bfloat16 (math in fp32, stored rounded), torch.uint8: 8-bit codes in blocks of
    256 elements with one fp32 absmax :math:`a` per block (``state["state_absmax"]``), a code
    :math:`c` holding {maps}, rounded to the nearest code after each step (or stochastically,
    as ``stochastic_rounding`` says), or torch.uint4: 4-bit codes in torchao's ``AdamW4bit``
    scheme, two to a byte of a 1-D uint8 tensor, in blocks of 128 elements with one fp32
    absmax each, the first moment on torchao's signed dynamic map, the second on
    :math:`(c+1)/16`, always rounded to the nearest code.""",
    "min_8bit_size": r"""min_8bit_size (int): with ``state_dtype=torch.uint8`` or ``torch.uint4``, params with
    fewer elements keep fp32 state (default: 4096; a one-element param always does with 4-bit
    state).""",
    "stochastic_rounding": r"""stochastic_rounding (bool, optional): round what is stored in fewer than 32 bits (bf16
    state, 8-bit codes, 24-bit masters) stochastically (True) or to nearest (False).
    Default None: {rounding_default}. A code rounds up with the probability that makes its
    value unbiased (between codes c and c + 1, :math:`(t-c^2)/(2c+1)` where
    :math:`t = 127^2\,|m|/a` or :math:`255^2\,v/a`); loading a checkpoint quantizes to
    nearest. The random bits depend on ``rounding_seed``, the step and the element's index
    only, so runs repeat exactly and a CUDA graph replays the same.""",
    "rounding_seed": r"""rounding_seed (int, optional): seed of the stochastic rounding (default: drawn from
    ``torch.initial_seed()``, which ``torch.manual_seed`` sets).""",
    "unscale_grads": r"""unscale_grads (bool): after a step that a GradScaler scaled, leave ``p.grad`` unscaled,
    as torch's optimizers do (default: True). False skips that write (2 bytes per param
    for half grads), leaving the grads scaled: for loops that zero them anyway.""",
    "max_grad_norm": r"""max_grad_norm (float, optional): clip the gradients at every step to this total norm
    (of all params' unscaled grads, as ``torch.nn.utils.clip_grad_norm_``), inside the
    fused step (default: None: no clipping). See :meth:`clip_grad_norm_` for clipping
    chosen per step.""",
    "grad_norm_type": r"""grad_norm_type (float): the norm of ``max_grad_norm``: 2.0 (default), 1.0 or inf.""",
    "float8_scales": r"""float8_scales (bool, optional): hand the fp8 scales of torchao's float8 weights under
    FSDP2's fp8 all-gather over from the step: each weight's amax is formed in the pass
    that writes it, and its ``_precomputed_scale`` set as
    ``torchao.float8.precompute_float8_dynamic_scale_for_fsdp`` sets it (bitwise, one
    all-reduce), so that call and its read of every weight are not needed. Default None:
    where such weights are found; True: also, and refuse a model without them; False: never.
    See the fp8 training page.""",
}
_MAPS = {True: r":math:`a\,\mathrm{sign}(c)(c/127)^2` (signed: {keys})",
         False: r":math:`a\,(c/255)^2` (unsigned: {keys})"}


def options_doc(states, running_sums=False, notes=None, indent=8) -> str:
    """The Args entries of FUSED_AMP_OPTIONS for an optimizer whose step keeps ``states``
    ((key, signed) pairs, from the step op's table), with its ``notes`` (option -> a sentence
    of its own) after the common text, indented for a docstring's Args section."""
    keys = [f"``{key}``" for key, _ in states]
    names = ", ".join(keys[:-1]) + (" and " if len(keys) > 1 else "") + keys[-1] if keys else "its state"
    maps = " or ".join(_MAPS[signed].replace("{keys}", ", ".join(f"``{k}``" for k, s in states if s == signed))
                       for signed in (True, False) if any(s == signed for _, s in states))
    rounding_default = ("stochastically for 24-bit masters and for this optimizer's running sums in "
                        "bf16 and 8 bits (to nearest, increments below half a step would be lost), "
                        "to nearest for its other state" if running_sums else
                        "stochastically for 24-bit masters (to nearest, updates below half their ulp, "
                        "2^-16 at 1.0, are lost), to nearest for bf16 state and 8-bit codes")
    entries = []
    for option in FUSED_AMP_OPTIONS:
        text = _OPTION_DOCS[option].format(states=names, maps=maps,
                                           rounding_default=rounding_default)
        if notes and option in notes:
            text += " " + notes[option]
        entries.append(textwrap.fill(" ".join(text.split()), width=100, initial_indent=" " * indent,
                                     subsequent_indent=" " * (indent + 4), break_on_hyphens=False,
                                     break_long_words=False))
    return "\n".join(entries)


# torch's flags (check_torch_flags), written once and put into every optimizer's docstring
# where it says {torch_flags}, naming the flags its __init__ takes (torch's _foreach_doc,
# _maximize_doc, _differentiable_doc, ...): ``torch_flags_doc``
_ACCEPTED_FLAGS = ("foreach", "fused", "capturable")


def torch_flags_doc(init, indent=8) -> str:
    """The Args entries of torch's maximize, foreach/fused/capturable and differentiable, for
    the flags ``init`` takes, indented for a docstring's Args section."""
    taken = inspect.signature(init).parameters
    accepted = ", ".join(flag for flag in _ACCEPTED_FLAGS if flag in taken)
    entries = ["maximize (bool): maximize the objective instead of minimizing (default: False).",
               f"{accepted}: accepted with torch's checks; the step is always one fused pass that runs "
               "on the device (capturable) whatever they say.",
               "differentiable (bool): must be False: the fused step runs outside autograd."]
    return "\n".join(textwrap.fill(entry, width=100, initial_indent=" " * indent,
                                   subsequent_indent=" " * (indent + 4)) for entry in entries)


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
