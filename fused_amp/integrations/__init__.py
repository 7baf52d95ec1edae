"""Using fused_amp inside frameworks: accelerate and HF Trainer (``install_grad_scaler``), and
torchtitan (``fused_amp.integrations.torchtitan``, imported on its own: it needs torchtitan).

Lightning needs nothing here: pass ``fused_amp.GradScaler`` to its ``MixedPrecision`` plugin,
and clip through the optimizer's ``max_grad_norm`` (examples/lightning_train.py)."""
from fused_amp.integrations.accelerate import install_grad_scaler

__all__ = ["install_grad_scaler"]
