"""The memory modes: one Adam step (scaler step + update) on bf16 params in each way of keeping
the optimizer state, timed in turns with torch's AMP recipe on the same data (recipes.py); and
their convergence on real text (convergence.py), over 3 seeds.

Each mode is credited with its own roofline bytes per param (roofline.py): the step's reads and
writes, plus the scaler's check of the grads and the unscaled grads written back (2 + 2 for bf16
grads, 4 + 4 for fp32), which every timed step also moves."""
from fused_amp.benchmark import convergence, harness, recipes, workloads

# every way of keeping Adam's state on bf16 params (recipes.py), with fused_amp on fp32 params (the
# same 28 bytes as fp32 masters, without the conversions) and the outside anchors with 8- and
# 4-bit state
MODES = [name for name in recipes.RECIPES if name not in ("torch_bf16", "fused_amp[no masters]")]
CONVERGENCE_STEPS = 1500
_converged = {}  # the losses do not change between repeats of the plan: trained once per process


def cases(ctx):
    n = (16_000_000 if ctx.quick else 84_000_000) if ctx.device == "cpu" else (128_000_000 if ctx.quick else 300_000_000)
    out = [(f"adam/bfloat16/{n // 1_000_000}M/modes", lambda c, n=n: run_modes(c, workloads.model_like_shapes(n)))]
    if ctx.device != "cpu":
        return out  # the same math on any device; the CPU run is the record
    if ctx.quick:
        ctx.skip("memory", "charlm/convergence", f"full runs only (3 seeds x {CONVERGENCE_STEPS} steps per mode)")
    else:
        out.append(("charlm/convergence", run_convergence))
    return out


def run_modes(ctx, shapes):
    shapes = workloads.scaled(shapes, ctx.scale)
    case = f"adam/bfloat16/{workloads.n_params(shapes) // 1_000_000}M/modes"
    return recipes.run(ctx, "memory", case, shapes, MODES, skip_anchors=ctx.quick)


def run_convergence(ctx):
    """Final held-out loss per mode (mean of 3 seeds; loss_seeds and loss_spread beside it), and
    the seconds per training step (the first repeat's: later repeats report the same runs)."""
    modes = [m for m in convergence.MODES if convergence.available(m)]
    for m in convergence.MODES:
        if m not in modes:
            ctx.skip("memory", f"charlm/convergence {m}",
                     recipes.not_installed(convergence.OPTIONAL[m]))
    key = tuple(modes)
    if key not in _converged:
        _converged[key] = convergence.compare(modes, seeds=[0, 1, 2], steps=CONVERGENCE_STEPS)
    results = _converged[key]
    n = sum(p.numel() for p in convergence.CharMLP().parameters())
    times = {m: [r["seconds_per_step"]] for m, r in results.items()}
    records = harness.make_records("memory", "charlm/convergence", "cpu", "bfloat16", n, 5, times,
                                   ctx.ceiling_gbps, None)
    fp32 = results["fp32 masters"]["mean"]
    for rec in records:
        r = results[rec["impl"]]
        rec.update(loss=r["mean"], loss_seeds=r["losses"], loss_spread=r["spread"],
                   loss_vs_fp32_masters=r["mean"] / fp32 - 1, steps=CONVERGENCE_STEPS)
    ctx.note("memory", "charlm: " + ", ".join(f"{m} {r['mean']:.4f}±{r['spread'] / 2:.4f}"
                                              for m, r in results.items()))
    return records
