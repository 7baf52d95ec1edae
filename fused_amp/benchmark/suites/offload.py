"""The CPU step of an offload engine, as the engines call it: the bare step (no scaler).
``bare/float32``: a model's fp32 params in one step, fused_amp's Adam against torch's fused CPU
Adam (FSDP2's offload steps the host shards with the user's optimizer) and DeepSpeed's
``DeepSpeedCPUAdam`` (ZeRO-Offload's), at 84M params and at the largest size three side by side
fit in memory (up to 1B; where that is less, fused_amp's alone at 1B where it fits).
``bare/modes``: the same step in each of fused_amp's memory modes on bf16 params, with those two
on fp32 params. ``one-param``: torchao's ``CPUOffloadOptimizer`` makes one optimizer per param
(of 4,096+ elements) and steps them one after another, so what a step costs on the host counts
as much as its loop: fused_amp's AdamW against torch's fused CPU AdamW (the engine's default
``optimizer_class``) and DeepSpeed's CPU AdamW on one tensor. Each in turns. (The same step with a GradScaler, against the same anchor: the memory suite's
``fused_amp[fp32 params]`` and ``deepspeed[Adam]``.)"""
import torch

import fused_amp.optim
from fused_amp.benchmark import harness, recipes, workloads
from fused_amp.benchmark.roofline import bytes_per_param

SIZES = {"4k": 4096, "64k": 65536, "1M": 1 << 20}
LARGEST = 1_000_000_000  # the large bare case's size where memory allows it
# the recipes of the memory modes' bare step (recipes.py): torch's fused Adam and DeepSpeed's
# on fp32 params, fused_amp on fp32 params and in each mode on bf16 params
MODES = [recipes.TORCH, "fused_amp[fp32 params]", "fused_amp", "fused_amp[remainder]", "fused_amp[bf16 state]",
         "fused_amp[remainder + bf16 state]", "fused_amp[8-bit state]", "fused_amp[remainder + 8-bit state]",
         "fused_amp[24-bit masters]", "fused_amp[24-bit masters + 8-bit state]",
         "fused_amp[remainder + 4-bit state]", "fused_amp[24-bit masters + 4-bit state]", "deepspeed[Adam]"]


def _deepspeed_cpu_adam(params, adamw=False, **kw):
    from deepspeed.ops.adam import DeepSpeedCPUAdam  # (its op compiles on first use)
    return DeepSpeedCPUAdam(params, adamw_mode=adamw, **kw)


# the bare step's Adams, by implementation; with the package each needs (None: none)
BARE = {"fused_amp": (lambda params: fused_amp.optim.Adam(params, lr=1e-3), None),
        "torch_fused": (lambda params: torch.optim.Adam(params, lr=1e-3, fused=True), None),
        "deepspeed[Adam]": (lambda params: _deepspeed_cpu_adam(params, lr=1e-3), "deepspeed")}
# the one-param step's AdamWs, likewise
ONE_PARAM = {"fused_amp": (fused_amp.optim.AdamW, None),
             "torch_fused": (lambda p, **kw: torch.optim.AdamW(p, fused=True, **kw), None),
             "deepspeed[AdamW]": (lambda p, **kw: _deepspeed_cpu_adam(p, adamw=True, **kw), "deepspeed")}


def cases(ctx):
    if ctx.device != "cpu":  # (the engines step on the host)
        return []
    n = 16_000_000 if ctx.quick else 84_000_000
    out = [(f"bare/float32/{n // 1_000_000}M", lambda c, n=n: run_bare(c, n))]
    if ctx.quick:
        ctx.skip("offload", "bare/float32/large", "full runs only (as large as memory allows)")
    else:
        large = _largest_bare(ctx, 3)
        out.append((f"bare/float32/{large // 1_000_000}M", lambda c, n=large: run_bare(c, n)))
        if large < LARGEST and _largest_bare(ctx, 1) == LARGEST:  # (fused_amp alone: its GB/s at 1B)
            out.append((f"bare/float32/{LARGEST // 1_000_000}M/alone",
                        lambda c: run_bare(c, LARGEST, ("fused_amp",))))
    out.append((f"bare/{n // 1_000_000}M/modes", lambda c, n=n: run_modes(c, n)))
    return out + [(f"one-param/float32/{label}", lambda c, n=n, label=label: run(c, n, label))
                  for label, n in SIZES.items()]


def _largest_bare(ctx, side_by_side: int) -> int:
    """The bare fp32 case's size: LARGEST, or what ``side_by_side`` implementations (16 bytes per
    param each: param, grad, two moments) fit in 70% of the free memory, in tens of millions."""
    fits = int(0.7 * recipes.free_bytes(ctx.device) / (side_by_side * 16))
    return max(10_000_000, min(LARGEST, fits) // 10_000_000 * 10_000_000)


def _params(shapes, seed=0):
    """fp32 params of ``shapes`` with grads, drawn anew for each implementation (the same values
    for all): no list is held beside the implementations' own."""
    gen = torch.Generator().manual_seed(seed)
    params = []
    for s in shapes:
        p = torch.nn.Parameter(torch.randn(s, generator=gen))
        p.grad = 1e-3 * torch.randn(s, generator=gen)
        params.append(p)
    return params


def run_bare(ctx, n, names=tuple(BARE)):
    shapes = workloads.scaled(workloads.model_like_shapes(n), ctx.scale)
    case = f"bare/float32/{n // 1_000_000}M" + ("/alone" if len(names) == 1 else "")
    timed, held = [], {}
    for name in names:
        make, module = BARE[name]
        if module and ctx.quick:  # (DeepSpeed compiles its op first: about a minute)
            ctx.skip("offload", f"{case} {name}", "full runs only")
            continue
        if module and not recipes.installed(module):
            ctx.skip("offload", f"{case} {name}", recipes.not_installed(module))
            continue
        params = _params(shapes)
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


def run_modes(ctx, n):
    """Each memory mode's bare step, in batches that fit beside torch's fused Adam (recipes.run)."""
    shapes = workloads.scaled(workloads.model_like_shapes(n), ctx.scale)
    case = f"bare/{workloads.n_params(shapes) // 1_000_000}M/modes"
    return recipes.run(ctx, "offload", case, shapes, MODES, skip_anchors=ctx.quick, bare=True)


def run(ctx, n, label):
    n = max(1, int(n * ctx.scale))
    steps = max(5, 5_000_000 // n)  # per timed run: a few ms at least, the timer's noise far below
    gen = torch.Generator().manual_seed(0)
    start, grad = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    case = f"one-param/float32/{label}"
    chosen = []
    for name, (_, module) in ONE_PARAM.items():
        if module and ctx.quick:
            ctx.skip("offload", f"{case} {name}", "full runs only")
        elif module and not recipes.installed(module):
            ctx.skip("offload", f"{case} {name}", recipes.not_installed(module))
        else:
            chosen.append(name)

    def impl(name):
        param = torch.nn.Parameter(start.clone())
        param.grad = grad.clone()
        with recipes.torch_env_kept():
            optimizer = ONE_PARAM[name][0]([param], lr=1e-3, weight_decay=0.01)
            optimizer.step()  # (its state made before the timing)

        def go():
            for _ in range(steps):
                optimizer.step()
        return harness.Impl(name, go)

    timed = [impl(name) for name in chosen]
    times = harness.time_alternating(timed, ctx.device, ctx.reps)
    per_step = {name: [t / steps for t in ts] for name, ts in times.items()}
    # (no bandwidth figure: one tensor of these sizes stays in the caches, above memory's ceiling)
    return harness.make_records("offload", case, ctx.device, "float32", n, 1, per_step,
                                ctx.ceiling_gbps, None)
