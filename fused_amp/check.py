"""Half-precision pitfalls found before training instead of after a NaN (``check_model``).

Each kind of finding predicts a failure that torch really shows (tests/test_check.py shows each
one happening): nothing is reported on a guess about how an op computes."""
import copy
from dataclasses import dataclass
from typing import Any, List, Optional

import torch

__all__ = ["Finding", "check_model"]

_HALF = (torch.float16, torch.bfloat16)
# torch optimizers whose non-fused implementations do their arithmetic, eps included, in the
# param dtype (fused=True computes in fp32)
_EPS_IN_PARAM_DTYPE = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "RMSprop", "Adadelta")


@dataclass
class Finding:
    """One pitfall that :func:`check_model` found.

    Attributes:
        kind (str): what kind of pitfall (e.g. ``"update-vanishes"``, ``"eps-underflow"``).
        where (str): the module path of the param or buffer, or the stage (forward, backward).
        value: the offending value (an eps, a magnitude, a loss, a share of elements, ...).
        problem (str): what goes wrong in training.
        fix (str): what to do about it.
    """
    kind: str
    where: str
    value: Any
    problem: str
    fix: str

    def __str__(self):
        return f"[{self.kind}] {self.where}: {self.value!r}: {self.problem}; {self.fix}"


def _in_dtype(x: float, dtype: torch.dtype) -> float:
    return torch.tensor(x, dtype=torch.float64).to(dtype).item()


def _check_optimizer(optimizer, dtype, names) -> List[Finding]:
    """A torch optimizer that updates fp16/bf16 params without fp32 masters and computes in the
    param dtype (not fused), with an eps that is 0 in that dtype: where the second moment is 0
    (a grad that is 0 from the start, e.g. an unused embedding row) the update is 0/0 = NaN."""
    from fused_amp.optim._base import MasterWeightOptimizer
    if (isinstance(optimizer, MasterWeightOptimizer) or type(optimizer).__name__ not in _EPS_IN_PARAM_DTYPE
            or not type(optimizer).__module__.startswith("torch.optim")):
        return []
    out = []
    for i, group in enumerate(optimizer.param_groups):
        eps = group.get("eps")
        if not eps or group.get("fused"):
            continue
        for p in group["params"]:
            # the model's float params train in `dtype` (or already are half)
            pdtype = p.dtype if p.dtype in _HALF else (dtype if p.is_floating_point() else None)
            if pdtype in _HALF and _in_dtype(eps, pdtype) == 0.0:
                out.append(Finding(
                    "eps-vanishes", f"{type(optimizer).__name__} param group {i} ({names.get(p, 'a param')})",
                    eps, f"eps is 0 in {pdtype}, and {type(optimizer).__name__} without fused=True "
                    "computes in the param dtype: where the second moment is 0 the update is 0/0 = NaN",
                    "use fused_amp.optim (fp32 masters and math), fused=True, or eps >= "
                    f"{torch.finfo(pdtype).tiny:g}"))
                break
    return out


_EPS_NAMES = ("eps", "epsilon", "variance_epsilon")


# optimizers whose updates are about lr in size whatever the grad's scale (normalized or signed)
_UPDATE_ABOUT_LR = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Lion")
_MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, "24-bit": 15}


def _applied_in(optimizer, group, p, dtype):
    """The precision a param's update is really applied in: a half dtype (no masters), "24-bit"
    (24-bit masters rounded to nearest), or None (fp32 masters or math, or stochastic rounding,
    which keeps small updates in expectation)."""
    from fused_amp.optim import _memory
    from fused_amp.optim._base import MasterWeightOptimizer
    pdtype = p.dtype if p.dtype in _HALF else (dtype if p.is_floating_point() else None)
    if pdtype not in _HALF:
        return None
    if isinstance(optimizer, MasterWeightOptimizer):
        kind = _memory.master_kind(group)
        if _memory.rounded_master(kind) and not _memory.stochastic(group):
            return "24-bit"
        return pdtype if kind is None else None
    return pdtype if type(optimizer).__module__.startswith("torch.optim") else None


def _check_vanishing_updates(optimizer, dtype, names) -> List[Finding]:
    """Params whose updates round away: an optimizer whose update is about lr (Adam's family,
    Lion) where lr is below half an ulp of the weight in the precision the update is applied in
    (the seed's Remark 2: a small number added to a large one in half precision does nothing).
    E.g. AdamW at lr 1e-5 on bf16 weights of about 1.0, whose ulp is 2^-7."""
    if type(optimizer).__name__ not in _UPDATE_ABOUT_LR:
        return []
    out = []
    for i, group in enumerate(optimizer.param_groups):
        lr = float(group["lr"])
        for p in group["params"]:
            precision = _applied_in(optimizer, group, p, dtype)
            if precision is None or p.numel() == 0 or lr == 0.0:
                continue
            w = p.detach().to(torch.float32 if precision == "24-bit" else precision).float().abs()
            # half an ulp of |w| = mantissa * 2^e (mantissa in [0.5, 1)): 2^(e - 2 - bits)
            _, exponent = torch.frexp(w)
            half_ulp = torch.ldexp(torch.ones_like(w), exponent - 2 - _MANTISSA_BITS[precision])
            lost = (w > 0) & (half_ulp > lr)
            share = lost.float().mean().item()
            if share == 0.0:
                continue
            typical = w[lost].median().item()
            ulp = 2.0 * torch.ldexp(torch.ones(()), torch.frexp(torch.tensor(typical))[1] - 2
                                    - _MANTISSA_BITS[precision]).item()
            where = f"{type(optimizer).__name__} param group {i} ({names.get(p, 'a param')})"
            fix = ("use stochastic rounding (stochastic_rounding=None or True) or master_weights=True"
                   if precision == "24-bit" else "keep fp32 masters: fused_amp.optim with master_weights=True")
            out.append(Finding(
                "update-vanishes", where, lr,
                f"{share:.0%} of its elements have half an ulp above lr in {precision} (the ulp at "
                f"their median |w| {typical:.3g} is {ulp:.3g}): updates of about lr round away and "
                "those weights never change", fix))
    return out


def _check_constants(model, dtype) -> List[Finding]:
    """Modules holding an eps that is 0 in ``dtype``, found by running them: a copy of the
    module in ``dtype`` on an all-zero input (the input where a vanished eps divides by zero)
    must give NaN/inf where the float32 module gives finite values. Modules that compute in fp32
    whatever their dtype (LayerNorm, GroupNorm, BatchNorm take eps as a double) pass this run,
    so they are never reported; modules whose input shape cannot be told from their weight, or
    whose forward fails on it, are not judged."""
    out = []
    for name, module in model.named_modules():
        eps_name = next((n for n in _EPS_NAMES if isinstance(getattr(module, n, None), float)), None)
        if eps_name is None:
            continue
        eps = getattr(module, eps_name)
        weight = getattr(module, "weight", None)
        if eps == 0.0 or _in_dtype(eps, dtype) != 0.0 or not isinstance(weight, torch.Tensor):
            continue
        zeros = torch.zeros((2,) + tuple(weight.shape), device=weight.device)
        try:
            with torch.no_grad():
                reference = copy.deepcopy(module).float()(zeros)
                half = copy.deepcopy(module).to(dtype)(zeros.to(dtype))
        except Exception:  # noqa: BLE001  (a forward that needs other input is not judged)
            continue
        if (isinstance(reference, torch.Tensor) and torch.isfinite(reference).all()
                and isinstance(half, torch.Tensor) and not torch.isfinite(half).all()):
            out.append(Finding(
                "eps-vanishes", f"module {name or type(module).__name__} ({type(module).__name__}.{eps_name})",
                eps, f"0 in {dtype}, and this module computes in {dtype}: an all-zero input gives "
                "NaN/inf (0/0) where float32 gives finite values",
                f"use eps >= {torch.finfo(dtype).tiny:g}, or compute this module in float32"))
    return out


def _check_values(model, dtype) -> List[Finding]:
    """Params and buffers whose values are beyond ``dtype``'s range: inf after the cast."""
    out = []
    limit = torch.finfo(dtype).max
    for kind, items in (("param", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in items:
            if not t.is_floating_point() or t.numel() == 0:
                continue
            biggest = t.detach().abs().max().item()
            if biggest > limit:
                out.append(Finding(
                    "overflows-dtype", f"{kind} {name}", biggest,
                    f"beyond {dtype}'s largest value {limit:g}: it becomes inf when cast",
                    f"keep this {kind} in float32, rescale it, or train in bfloat16"))
    return out


def _check_first_backward(model, dtype, example_input, loss_fn, init_scale) -> List[Finding]:
    """The first backward of the scaled loss, in ``dtype``: inf/NaN grads there mean the first
    steps are skipped while the scale backs off (or, where the loss itself is inf, forever)."""
    trial = copy.deepcopy(model).to(dtype)
    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    inputs = tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                   for x in inputs)
    out = trial(*inputs)
    loss = loss_fn(out) if loss_fn is not None else out.float().sum()
    if not torch.isfinite(loss).all():
        return [Finding("loss-not-finite", "the loss of the example input", loss.item(),
                        f"the forward pass in {dtype} already gives a non-finite loss; no loss "
                        "scale can help", "find the op that overflows in the forward pass")]
    (loss.float() * init_scale).backward()
    biggest = max((p.grad.detach().abs().max().item() for p in trial.parameters() if p.grad is not None),
                  default=0.0)
    if biggest == float("inf") or biggest != biggest:
        return [Finding("init-scale-overflows", "GradScaler init_scale", init_scale,
                        f"the first backward in {dtype} overflows: the first steps are skipped "
                        "while the scale backs off",
                        "start from a smaller init_scale (e.g. 2**10), the scaler then grows it")]
    return []


def check_model(model: torch.nn.Module, dtype: torch.dtype = torch.float16,
                optimizer: Optional[torch.optim.Optimizer] = None, *,
                example_input: Any = None, loss_fn=None,
                init_scale: Optional[float] = None) -> List[Finding]:
    """Half-precision pitfalls of training ``model`` in ``dtype`` (float16 or bfloat16), found
    before training; an empty list when there are none. Each finding names where it is, the
    value, what goes wrong and what to do, and prints as one line.

    * ``optimizer`` (optional): a torch optimizer that would update fp16/bf16 params in that
      dtype, without fp32 masters, with an eps that is 0 there (0/0 = NaN where a grad is 0);
      and updates that vanish: an optimizer whose update is about lr (Adam's family, Lion;
      torch's, or ours without masters or with 24-bit masters rounded to nearest) on weights
      whose half ulp, in the precision the update is applied in, is above lr (the share of each
      param's elements, lr, the ulp, and the fix).
    * params and buffers beyond the dtype's range (inf once cast).
    * modules with an ``eps`` (``epsilon``, ``variance_epsilon``) that is 0 in the dtype and
      that really compute in it: run in the dtype on a zero input, they give NaN/inf where
      float32 does not (torch's norm layers compute in fp32 and are never reported).
    * with ``example_input`` and ``init_scale``: a loss scale whose first backward overflows,
      and a forward pass whose loss is already inf/NaN (``loss_fn(output)``, default the sum).
    """
    if dtype not in _HALF:
        raise ValueError(f"check_model: dtype must be torch.float16 or torch.bfloat16, got {dtype}")
    names = {p: n for n, p in model.named_parameters()}
    findings = _check_values(model, dtype) + _check_constants(model, dtype)
    if optimizer is not None:
        findings += _check_optimizer(optimizer, dtype, names) + _check_vanishing_updates(optimizer, dtype, names)
    if example_input is not None and init_scale is not None:
        findings += _check_first_backward(model, dtype, example_input, loss_fn, init_scale)
    return findings
