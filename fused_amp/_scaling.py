"""Which GradScaler's scale is in an optimizer's grads, for a norm taken before the step
(``optimizer.clip_grad_norm_`` without ``scaler.unscale_``).

An optimizer stepped through a scaler belongs to that scaler; one stepped without any (a bf16
model beside an fp16 one) belongs to none, so its norm is never divided by another model's
scale. Before its first step an optimizer is taken to belong to the scaler that last scaled a
loss: the one whose backward produced the grads in the usual loop."""
import weakref
from typing import Optional

_stepped_by: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # optimizer -> ref or None
_latest: Optional["weakref.ref"] = None


def inv_scale(scale):
    """1/scale as torch's GradScaler.unscale_ forms it: reciprocal in double, rounded to fp32."""
    return scale.double().reciprocal().float()


def scaled_a_loss(scaler) -> None:
    global _latest
    _latest = weakref.ref(scaler)


def stepped(optimizer, scaler=None) -> None:
    """``optimizer`` stepped, through ``scaler`` (None: without one)."""
    _stepped_by[optimizer] = None if scaler is None else weakref.ref(scaler)


def scaler_of(optimizer):
    """The enabled scaler whose scale is in ``optimizer``'s grads, or None."""
    ref = _stepped_by[optimizer] if optimizer in _stepped_by else _latest
    scaler = ref() if ref is not None else None
    return scaler if scaler is not None and scaler.is_enabled() else None
