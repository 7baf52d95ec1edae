"""Gradient clipping inside the step: the clip options (group options, the same in every group),
``clip_grad_norm_`` (of one optimizer, and of several by one norm) and what is kept between it
and the step."""
import math
from typing import Optional

import torch

from fused_amp import _scaling
from fused_amp.optim._grad_norm import (additive_share, check_clip_options, check_same_clip_options,
                                        combine_shares, from_additive, total_grad_norm)


def check_finite(norm, norm_type) -> None:
    """``error_if_nonfinite``: torch's error for a norm that is inf or NaN (a host sync)."""
    if bool(norm.isnan() | norm.isinf()):
        raise RuntimeError(
            f"The total norm of order {float(norm_type)} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. To disable this error and scale the gradients "
            "by the non-finite norm anyway, set `error_if_nonfinite=False`")


class Clipping:
    """What clipping keeps between a norm and the step it clips, and how the norm is taken: the
    optimizer's ``_clip`` (MasterWeightOptimizer's clip methods call it). A plain object, not
    attributes of the optimizer: torch.compile (2.11) refuses attribute writes on an optimizer
    inside a compiled step."""

    def __init__(self):
        # (norm, max_norm, still_scaled) from clip_grad_norm_, for the next step
        self.pending = None
        self.last_norm: Optional[torch.Tensor] = None

    def record(self, norm, max_norm, still_scaled=False):
        """A norm taken for a step: logged, and (norm, max_norm, still_scaled) kept for that
        step. ``still_scaled``: the norm is of grads that a scaler we do not drive may have
        scaled (torch's GradScaler without ``unscale_``); the step divides it by the scale it
        receives."""
        self.last_norm = norm
        return norm, max_norm, still_scaled

    def take(self, optimizer, max_norm, norm_type, error_if_nonfinite) -> torch.Tensor:
        """``optimizer.clip_grad_norm_``: the norm of its grads, kept pending for its next step."""
        if optimizer._attached.in_backward is not None:
            raise RuntimeError(f"clip_grad_norm_: {type(optimizer).__name__} steps in backward (step_in_backward): "
                               "each param has stepped before the global norm of the grads could be known")
        scaler = _scaling.scaler_of(optimizer)
        inv_scale = optimizer._inv_scale()
        if scaler is not None:
            norm = scaler._grad_norm_pass(optimizer, norm_type)
        else:
            norm, _ = total_grad_norm(optimizer, norm_type, inv_scale)
        if error_if_nonfinite:
            check_finite(norm, norm_type)
        still_scaled = scaler is None and inv_scale is None and norm_type != 0.0
        self.pending = self.record(norm, float(max_norm), still_scaled)
        return norm

    def of_step(self, optimizer, inv_scale):
        """(norm, max_norm, still_scaled) that this step clips by, or None: the clip
        ``clip_grad_norm_`` left pending, or with ``max_grad_norm`` one taken now."""
        max_grad_norm, grad_norm_type = check_same_clip_options(type(optimizer).__name__, optimizer.param_groups)
        clip, self.pending = self.pending, None
        if clip is None and max_grad_norm is not None:
            norm, _ = total_grad_norm(optimizer, grad_norm_type, inv_scale)
            clip = self.record(norm, max_grad_norm)
        elif clip is not None and clip[2] and inv_scale is not None:
            # torch's GradScaler hands the step the scale of grads clip_grad_norm_ saw scaled:
            # the norm (the tensor it returned) becomes the unscaled one, in place
            clip[0].mul_(inv_scale.to(clip[0].device))
        return clip

    def before_step(self, optimizer, scaler) -> bool:
        """Called by GradScaler.step before it checks the grads: with ``max_grad_norm`` and no
        clip pending, the norm pass runs now and serves as the scaler's overflow check. True
        when it ran."""
        max_grad_norm, grad_norm_type = check_same_clip_options(type(optimizer).__name__, optimizer.param_groups)
        if max_grad_norm is None or self.pending is not None:
            return False
        self.pending = self.record(scaler._grad_norm_pass(optimizer, grad_norm_type), max_grad_norm)
        return True


def clip_option(optimizer, key):
    """A clip option (``max_grad_norm``, ``grad_norm_type``): the same in every group."""
    groups = optimizer.param_groups
    return groups[0][key] if groups else optimizer.defaults[key]


def set_clip_option(optimizer, key, value) -> None:
    """Sets a clip option in the defaults and every group, checked with the other."""
    options = {k: clip_option(optimizer, k) for k in ("max_grad_norm", "grad_norm_type")}
    options[key] = value
    check_clip_options(options["max_grad_norm"], options["grad_norm_type"])
    value = value if key == "max_grad_norm" else float(value)
    for group in [optimizer.defaults] + optimizer.param_groups:
        group[key] = value


@torch.compiler.disable  # eager, as each optimizer's clip_grad_norm_
def clip_grad_norm_(optimizers, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: Optional[bool] = None) -> torch.Tensor:
    r"""Clip the gradients of several fused_amp optimizers by one total norm, in their next steps.

    ``torch.nn.utils.clip_grad_norm_`` over the params of all ``optimizers`` at once, for a
    model whose params are split over optimizers: Muon for the matrices and AdamW for the rest,
    one optimizer per model chunk (torchtitan's interleaved pipeline schedules), or one per param
    (torchao's ``CPUOffloadOptimizer``). Clipping each by its own norm, as their own
    :meth:`~fused_amp.optim.Adam.clip_grad_norm_` or ``max_grad_norm`` would, clips each part
    of the model differently from torch's one clip.

    Each optimizer's norm is taken as its own ``clip_grad_norm_`` takes it: one fused read of its
    grads (the overflow check of a ``fused_amp.GradScaler`` that scaled them), combined over the
    mesh dims its DTensor grads are sharded on and over the pipeline stages it spans
    (:func:`~fused_amp.optim.span_stages`). The norms then combine into the total without a host
    sync: :math:`(\sum_i \lVert g_i \rVert^p)^{1/p}`, the maximum for ``inf`` (torch combines its
    per-tensor norms the same way). Each optimizer's next step multiplies its grads by
    ``min(1, max_norm / (total + 1e-6))``, and its ``last_grad_norm`` is the total. Every rank
    must call it with the same number of optimizers (each may all-reduce).

    Args:
        optimizers: fused_amp optimizers (an iterable).
        max_norm, norm_type, error_if_nonfinite: as torch's; ``foreach`` is accepted and ignored.

    Returns:
        The total norm of the unscaled grads of all the optimizers' params (before clipping), a
        0-dim float32 tensor on the first optimizer's first grad's device. Where
        ``torch.amp.GradScaler`` scaled them without ``unscale_``, it holds the unscaled norm once
        the first optimizer has stepped, as each optimizer's own ``clip_grad_norm_`` returns it.
    """
    from fused_amp.optim._base import MasterWeightOptimizer  # (the base holds a Clipping: imported here)
    optimizers = list(optimizers)
    for i, optimizer in enumerate(optimizers):
        if not isinstance(optimizer, MasterWeightOptimizer):
            raise TypeError(f"clip_grad_norm_: optimizers[{i}] is {type(optimizer).__name__}, not a fused_amp "
                            "optimizer (whose next step applies the clip)")
    # an infinite max_norm is torch's way to take the norm alone (a clip by 1): torchtitan's
    # training.max_norm=inf
    check_clip_options(None if float(max_norm) == math.inf else float(max_norm), norm_type)
    if not optimizers:
        return torch.zeros((), dtype=torch.float32)
    norm_type = float(norm_type)
    norms = [optimizer.clip_grad_norm_(max_norm, norm_type) for optimizer in optimizers]
    device = norms[0].device
    shares = [additive_share(n.to(device), norm_type) for n in norms]
    total = from_additive(combine_shares(shares, norm_type), norm_type)
    if error_if_nonfinite:
        try:
            check_finite(total, norm_type)
        except RuntimeError:
            for optimizer in optimizers:
                optimizer._clip.pending = None
            raise
    for i, optimizer in enumerate(optimizers):
        _, max_norm_i, still_scaled = optimizer._clip.pending
        # (each its own tensor where the step unscales it in place: Clipping.of_step)
        norm = total if i == 0 or not still_scaled else total.clone()
        optimizer._clip.pending = optimizer._clip.record(norm.to(norms[i].device), max_norm_i, still_scaled)
    return total
