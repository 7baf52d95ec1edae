"""The memory-bandwidth ceiling of the device, measured in this run."""
from benchmarks import harness


def cases(ctx):
    return [("bandwidth", run)]


def run(ctx):
    size = int((1 << 30) * min(1.0, ctx.scale))
    measured = harness.measure_ceiling(ctx.device, n_bytes=max(size, 1 << 20), reps=5 if ctx.quick else 11)
    ctx.ceiling_gbps = measured["ceiling_gbps"]
    ctx.ceiling = measured
    return []
