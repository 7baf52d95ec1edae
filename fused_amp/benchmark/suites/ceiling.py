"""The memory-bandwidth ceiling of the device, measured in this run."""
from fused_amp.benchmark import harness


def cases(ctx):
    return [("bandwidth", run)]


def run(ctx):
    # arrays of 1 GiB (256 MiB in a quick run), each far larger than the caches
    size = int((1 << 28 if ctx.quick else 1 << 30) * min(1.0, ctx.scale))
    measured = harness.measure_ceiling(ctx.device, n_bytes=max(size, 1 << 20), reps=5)
    ctx.add_ceiling(measured)
    return []
