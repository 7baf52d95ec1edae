"""fused_amp: fused multi-tensor kernels for mixed-precision training in PyTorch."""
import torch  # noqa: F401  (loads libtorch before the extension)

from fused_amp import _C, float8, integrations, ops, optim  # noqa: F401
from fused_amp.check import Finding, check_model
from fused_amp.grad_scaler import GradScaler, OverflowReport

__all__ = ["Finding", "GradScaler", "OverflowReport", "build_info", "check_model", "float8", "integrations", "ops",
           "optim"]


def build_info():
    """How the extension was built: ``torch_version`` it was built against, ``cuda`` (CUDA
    kernels compiled), ``cuda_archs``, and ``cpu_isa``, the instruction set the CPU kernels use
    on this machine (``DEFAULT``, ``AVX2`` or ``AVX512``, following torch's own choice)."""
    return dict(_C.build_info())
