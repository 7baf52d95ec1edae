"""Adam step time against parameter count and against tensor count: overhead and slope."""
from fused_amp.benchmark import workloads
from fused_amp.benchmark.suites import optimizer


def cases(ctx):
    if ctx.quick:
        sizes, counts = [1, 4, 16], [10, 100, 1000]
    elif ctx.device == "cpu":  # up to 64M: a full run (3 repeats) keeps to 5 minutes on 2 cores
        sizes, counts = [1, 4, 16, 64], [10, 100, 1000, 10_000]
    else:
        sizes, counts = [1, 4, 16, 64, 256, 1024], [10, 100, 1000, 10_000, 30_000]
    out = [(f"params/{m}M", lambda c, m=m: optimizer.run(
        c, "adam", "bfloat16", workloads.model_like_shapes(m * 1_000_000), "scaling", f"params/{m}M"))
        for m in sizes]
    out += [(f"tensors/{k}-x-1k", lambda c, k=k: optimizer.run(
        c, "adam", "bfloat16", workloads.many_small_shapes(k, 1000), "scaling", f"tensors/{k}-x-1k"))
        for k in counts]
    return out
