"""The CPU step of an offload engine, as the engine calls it. So far one case: torchao's
``CPUOffloadOptimizer`` makes one optimizer per param (of 4,096+ elements) and steps them one
after another, so what a step costs on the host counts as much as its loop. fused_amp's AdamW
against torch's fused CPU AdamW (the engine's default ``optimizer_class``), each stepping one
fp32 tensor, the bare step (no scaler, as the engine calls it), in turns."""
import torch

import fused_amp.optim
from fused_amp.benchmark import harness

SIZES = {"4k": 4096, "64k": 65536, "1M": 1 << 20}


def cases(ctx):
    if ctx.device != "cpu":  # (the engines step on the host)
        return []
    return [(f"one-param/float32/{label}", lambda c, n=n, label=label: run(c, n, label))
            for label, n in SIZES.items()]


def run(ctx, n, label):
    n = max(1, int(n * ctx.scale))
    steps = max(5, 5_000_000 // n)  # per timed run: a few ms at least, the timer's noise far below
    gen = torch.Generator().manual_seed(0)
    start, grad = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    optimizers = {"fused_amp": fused_amp.optim.AdamW, "torch_fused": lambda p, **kw: torch.optim.AdamW(
        p, fused=True, **kw)}

    def impl(name):
        param = torch.nn.Parameter(start.clone())
        param.grad = grad.clone()
        optimizer = optimizers[name]([param], lr=1e-3, weight_decay=0.01)
        optimizer.step()  # (its state made before the timing)

        def go():
            for _ in range(steps):
                optimizer.step()
        return harness.Impl(name, go)

    timed = [impl(name) for name in optimizers]
    times = harness.time_alternating(timed, ctx.device, ctx.reps)
    per_step = {name: [t / steps for t in ts] for name, ts in times.items()}
    # (no bandwidth figure: one tensor of these sizes stays in the caches, above memory's ceiling)
    return harness.make_records("offload", f"one-param/float32/{label}", ctx.device, "float32", n, 1, per_step,
                                ctx.ceiling_gbps, None)
