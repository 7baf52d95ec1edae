"""fused_amp's GradScaler in accelerate (and so in HF Trainer), which creates its own."""
from typing import Optional

from fused_amp.grad_scaler import GradScaler

__all__ = ["install_grad_scaler"]


def install_grad_scaler(accelerator, scaler: Optional[GradScaler] = None) -> GradScaler:
    """Make an ``accelerate.Accelerator`` use a fused_amp GradScaler instead of torch's.

    For an HF ``Trainer`` pass ``trainer.accelerator``. Call it before ``accelerator.prepare``
    (before ``trainer.train()``): the prepared optimizer takes the scaler it finds then.

    accelerate calls a step skipped, and holds the LR scheduler, only when ``optimizer.step()``
    was not called (huggingface/accelerate#4242: optimizers that skip on the device, ours and
    torch's fused ones, are always called, so their skips would advance the schedule). The
    installed scaler therefore has ``skip_on_host=True``: on an overflow it does not call the
    step, at the cost of one host sync per step, the sync torch's scaler makes for optimizers
    that cannot skip on the device. Without ``scaler``, one is made with the settings of the
    scaler accelerate made (its kwargs handler's), or the defaults when it made none (bf16).

    accelerate unscales before its own clipping only for fp16; with bf16 and this scaler, clip
    through the optimizer's ``max_grad_norm`` (and ``max_grad_norm=0`` in the Trainer's
    arguments), which unscales inside its norm.
    """
    if scaler is None:
        old = getattr(accelerator, "scaler", None)
        settings = {}
        if old is not None and old.is_enabled():
            settings = dict(init_scale=old.get_scale(), growth_factor=old.get_growth_factor(),
                            backoff_factor=old.get_backoff_factor(),
                            growth_interval=old.get_growth_interval())
        scaler = GradScaler(accelerator.device.type, **settings, skip_on_host=True)
    elif not isinstance(scaler, GradScaler) or not scaler._skip_on_host:
        raise ValueError("install_grad_scaler: scaler must be a fused_amp.GradScaler made with "
                         "skip_on_host=True, so that accelerate sees skipped steps")
    accelerator.scaler = scaler
    return scaler
