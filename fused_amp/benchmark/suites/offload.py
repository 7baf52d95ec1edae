"""The CPU step of an offload engine, as the engines call it: the bare step (no scaler) on fp32
params. ``bare``: a model's params in one step, fused_amp's Adam against torch's fused CPU Adam
(FSDP2's offload steps the host shards with the user's optimizer) and DeepSpeed's
``DeepSpeedCPUAdam`` (ZeRO-Offload's). ``one-param``: torchao's ``CPUOffloadOptimizer`` makes
one optimizer per param (of 4,096+ elements) and steps them one after another, so what a step
costs on the host counts as much as its loop: fused_amp's AdamW against torch's fused CPU AdamW
(the engine's default ``optimizer_class``) on one tensor. Each in turns. (The same step with a
GradScaler, against the same anchor: the memory suite's ``fused_amp[fp32 params]`` and
``deepspeed[Adam]``.)"""
import torch

import fused_amp.optim
from fused_amp.benchmark import harness, recipes, workloads
from fused_amp.benchmark.roofline import bytes_per_param

SIZES = {"4k": 4096, "64k": 65536, "1M": 1 << 20}


def _deepspeed_cpu_adam(params):
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # (its op compiles on first use)
    return DeepSpeedCPUAdam(params, lr=1e-3, adamw_mode=False)


# the bare step's Adams, by implementation; with the package each needs (None: none)
BARE = {"fused_amp": (lambda params: fused_amp.optim.Adam(params, lr=1e-3), None),
        "torch_fused": (lambda params: torch.optim.Adam(params, lr=1e-3, fused=True), None),
        "deepspeed[Adam]": (_deepspeed_cpu_adam, "deepspeed")}


def cases(ctx):
    if ctx.device != "cpu":  # (the engines step on the host)
        return []
    n = 16_000_000 if ctx.quick else 84_000_000
    return ([(f"bare/float32/{n // 1_000_000}M", lambda c, n=n: run_bare(c, n))]
            + [(f"one-param/float32/{label}", lambda c, n=n, label=label: run(c, n, label))
               for label, n in SIZES.items()])


def run_bare(ctx, n):
    case = f"bare/float32/{n // 1_000_000}M"
    shapes = workloads.scaled(workloads.model_like_shapes(n), ctx.scale)
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(s, generator=gen) for s in shapes]
    grads = [1e-3 * torch.randn(s, generator=gen) for s in shapes]
    timed, held = [], {}
    for name, (make, module) in BARE.items():
        if module and ctx.quick:  # (DeepSpeed compiles its op first: about a minute)
            ctx.skip("offload", f"{case} {name}", "full runs only")
            continue
        if module and not recipes.installed(module):
            ctx.skip("offload", f"{case} {name}", recipes.not_installed(module))
            continue
        params = [torch.nn.Parameter(v.clone()) for v in values]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        with recipes.torch_env_kept():
            optimizer = make(params)
            optimizer.step()  # (its state made before the timing; an anchor's op built)
        held[name] = {"held_bytes": harness.tensor_bytes(params + [p.grad for p in params] + [
            t for state in optimizer.state.values()
            for t in state.values() if isinstance(t, torch.Tensor)])}
        timed.append(harness.Impl(name, optimizer.step))
    times = harness.time_alternating(timed, ctx.device, ctx.reps)
    return harness.make_records("offload", case, ctx.device, "float32", workloads.n_params(shapes), len(shapes),
                                times, ctx.ceiling_gbps, bytes_per_param("adam", "float32"), held)


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
