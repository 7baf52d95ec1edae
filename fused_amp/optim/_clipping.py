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


class ClipState:
    """What clipping keeps between calls. A plain object, not attributes of the optimizer:
    torch.compile (2.11) refuses attribute writes on an optimizer inside a compiled step."""

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


class ClipGradNorm:
    """MasterWeightOptimizer's clipping: ``max_grad_norm``, ``clip_grad_norm_`` and the clip the
    next step applies (``self._clip``, a :class:`ClipState`)."""

    @property
    def max_grad_norm(self) -> Optional[float]:
        """The total norm the grads are clipped to at every step (None: no clipping), kept in
        every param group (and so in checkpoints); setting it sets it in all groups."""
        return self._clip_option("max_grad_norm")

    @max_grad_norm.setter
    def max_grad_norm(self, value):
        self._set_clip_option("max_grad_norm", value)

    @property
    def grad_norm_type(self) -> float:
        """The norm of ``max_grad_norm`` (2.0, 1.0 or inf), a group option as ``max_grad_norm``."""
        return self._clip_option("grad_norm_type")

    @grad_norm_type.setter
    def grad_norm_type(self, value):
        self._set_clip_option("grad_norm_type", value)

    def _clip_option(self, key):
        groups = self.param_groups
        return groups[0][key] if groups else self.defaults[key]

    def _set_clip_option(self, key, value):
        options = {"max_grad_norm": self.max_grad_norm, "grad_norm_type": self.grad_norm_type, key: value}
        check_clip_options(options["max_grad_norm"], options["grad_norm_type"])
        value = value if key == "max_grad_norm" else float(value)
        for group in [self.defaults] + self.param_groups:
            group[key] = value

    @torch.compiler.disable  # eager under torch.compile, as GradScaler.step (whose pass it may be)
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False, foreach: Optional[bool] = None) -> torch.Tensor:
        r"""Clip the gradients of this optimizer's params by their total norm, in the next step.

        The counterpart of ``torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)`` over
        this optimizer's params, with its return value: the total norm of the unscaled grads
        (before clipping), a 0-dim float32 tensor on the params' device, computed without a host
        sync. Call it where torch's is called, between backward and :meth:`step`, with or without
        ``scaler.unscale_(optimizer)`` before it: scaled grads are unscaled in the norm by the
        GradScaler that scaled the loss (``fused_amp.GradScaler``), and that pass is also the
        scaler's overflow check. ``torch.amp.GradScaler`` (which refuses to unscale fp16 grads)
        shows its scale to the optimizer only in ``scaler.step(optimizer)``: without ``unscale_``
        the norm is taken of the scaled grads and divided, in place, by the scale that step
        receives, so the clip is right, and the returned tensor holds the unscaled norm once
        ``scaler.step`` has run (read it after the step). Instead of rewriting the grads, the clip coefficient
        ``min(1, max_norm / (total_norm + 1e-6))`` is applied by the next :meth:`step`, which
        leaves the clipped grads in ``p.grad`` as torch does. ``foreach`` is accepted and
        ignored (one fused pass either way); ``zero_grad`` drops a clip not yet applied.
        """
        if self._attached.in_backward is not None:
            raise RuntimeError(f"clip_grad_norm_: {type(self).__name__} steps in backward (step_in_backward): each "
                               "param has stepped before the global norm of the grads could be known")
        scaler = _scaling.scaler_of(self)
        inv_scale = self._inv_scale()
        if scaler is not None:
            norm = scaler._grad_norm_pass(self, norm_type)
        else:
            norm, _ = total_grad_norm(self, norm_type, inv_scale)
        if error_if_nonfinite:
            check_finite(norm, norm_type)
        still_scaled = scaler is None and inv_scale is None and norm_type != 0.0
        self._clip.pending = self._clip.record(norm, float(max_norm), still_scaled)
        return norm

    def _clip_of_step(self, inv_scale):
        """(norm, max_norm, still_scaled) that this step clips by, or None: the clip
        ``clip_grad_norm_`` left pending, or with ``max_grad_norm`` one taken now."""
        max_grad_norm, grad_norm_type = check_same_clip_options(type(self).__name__, self.param_groups)
        clip, self._clip.pending = self._clip.pending, None
        if clip is None and max_grad_norm is not None:
            norm, _ = total_grad_norm(self, grad_norm_type, inv_scale)
            clip = self._clip.record(norm, max_grad_norm)
        elif clip is not None and clip[2] and inv_scale is not None:
            # torch's GradScaler hands the step the scale of grads clip_grad_norm_ saw scaled:
            # the norm (the tensor it returned) becomes the unscaled one, in place
            clip[0].mul_(inv_scale.to(clip[0].device))
        return clip

    def _clip_before_step(self, scaler) -> bool:
        """Called by GradScaler.step before it checks the grads: with ``max_grad_norm`` and no
        clip pending, the norm pass runs now and serves as the scaler's overflow check. True
        when it ran."""
        max_grad_norm, grad_norm_type = check_same_clip_options(type(self).__name__, self.param_groups)
        if max_grad_norm is None or self._clip.pending is not None:
            return False
        self._clip.pending = self._clip.record(scaler._grad_norm_pass(self, grad_norm_type),
                                               max_grad_norm)
        return True

    def _drop_pending_clip(self):
        """A clip belongs to the step it was taken for (GradScaler, skipping on the host)."""
        self._clip.pending = None

    @property
    def last_grad_norm(self) -> Optional[torch.Tensor]:
        """The pre-clip total norm of the unscaled grads at the latest clipped step (0-dim fp32
        tensor on the params' device), for logging; None before any."""
        return self._clip.last_norm


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
    optimizers = list(optimizers)
    for i, optimizer in enumerate(optimizers):
        if not isinstance(optimizer, ClipGradNorm):
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
                optimizer._drop_pending_clip()
            raise
    for i, optimizer in enumerate(optimizers):
        _, max_norm_i, still_scaled = optimizer._clip.pending
        # (each its own tensor where the step unscales it in place: _clip_of_step)
        norm = total if i == 0 or not still_scaled else total.clone()
        optimizer._clip.pending = optimizer._clip.record(norm.to(norms[i].device), max_norm_i, still_scaled)
    return total
