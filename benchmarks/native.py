"""Which half-precision dtypes this CPU multiplies natively: the train suite's autocast matmuls
in a dtype the CPU emulates run many times slower than fp32 (about 10x for bf16 on an AVX2-only
CPU) and would time the CPU's missing units, not fused_amp."""
import statistics
import time

import torch

# Above this many times the fp32 matmul time a dtype counts as emulated (native bf16/fp16
# units make it faster than fp32; oneDNN's AVX-512 emulation stays within about 2x).
EMULATED_ABOVE = 2.5


def matmul_slowdown(dtype: torch.dtype, n: int = 256, reps: int = 7) -> float:
    """How many times slower an n×n matmul is in ``dtype`` than in fp32 on the CPU."""
    def best(dt):
        a, b = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
        a @ b  # warm-up (oneDNN picks its kernel)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t)
        return statistics.median(times)
    return best(dtype) / best(torch.float32)


def probe(device: str) -> dict:
    """dtype name -> (slowdown against fp32, native?); a GPU is taken as native."""
    out = {}
    for name in ("bfloat16", "float16"):
        if device == "cuda":
            out[name] = (None, True)
        else:
            slowdown = matmul_slowdown(getattr(torch, name))
            out[name] = (slowdown, slowdown <= EMULATED_ABOVE)
    return out
