"""Which half-precision dtypes this CPU multiplies natively: the train suite's autocast matmuls
in a dtype the CPU emulates run many times slower than fp32 (about 10x for bf16 on an AVX2-only
CPU) and would time the CPU's missing units, not fused_amp."""
import time

import torch

# Above this many times the fp32 matmul time a dtype counts as emulated (native bf16/fp16
# units make it faster than fp32; oneDNN's AVX-512 emulation stays within about 2x).
EMULATED_ABOVE = 2.5


def matmul_slowdown(dtype: torch.dtype, n: int = 256, reps: int = 7) -> float:
    """How many times slower an n×n matmul is in ``dtype`` than in fp32 on the CPU: the two
    timed in turns, each by its fastest repetition (other load on the machine only ever adds
    time, so the minimum of each is what the matmul itself takes, and a burst of load cannot
    make an emulated dtype look native)."""
    pairs = {dt: (torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)) for dt in (dtype, torch.float32)}
    times = {dt: [] for dt in pairs}
    for a, b in pairs.values():
        a @ b  # warm-up (oneDNN picks its kernel)
    for _ in range(reps):
        for dt, (a, b) in pairs.items():
            t = time.perf_counter()
            a @ b
            times[dt].append(time.perf_counter() - t)
    return min(times[dtype]) / min(times[torch.float32])


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
