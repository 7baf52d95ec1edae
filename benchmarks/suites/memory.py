"""The memory modes: one Adam step (scaler step + update) on bf16 params in each way of keeping
the optimizer state, timed in turns with torch's AMP recipe and with fused_amp on fp32 params
(the same 28 bytes as fp32 masters, without the conversions), on the same data; and their
convergence on real text (benchmarks/convergence.py), over 3 seeds.

Each mode is credited with its own roofline bytes per param (benchmarks/roofline.py): the step's
reads and writes, plus the scaler's check of the grads and the unscaled grads written back
(2 + 2 for bf16 grads, 4 + 4 for fp32), which every timed step also moves."""
import torch

from benchmarks import convergence, harness, impls, workloads
from benchmarks.roofline import bytes_per_param

# impl name -> (fused_amp optimizer options, roofline operation); all on bf16 params except
# "fused_amp[fp32 params]"
MODES = {
    "fused_amp": ({}, "adam"),
    "fused_amp[remainder]": (dict(master_weights="remainder"), "adam_remainder"),
    "fused_amp[bf16 state]": (dict(state_dtype=torch.bfloat16), "adam_bf16_state"),
    "fused_amp[bf16 state, stochastic]": (dict(state_dtype=torch.bfloat16, stochastic_rounding=True,
                                              rounding_seed=0), "adam_bf16_state"),
    "fused_amp[remainder + bf16 state]": (dict(master_weights="remainder", state_dtype=torch.bfloat16),
                                          "adam_remainder_bf16_state"),
    "fused_amp[8-bit state]": (dict(state_dtype=torch.uint8), "adam_8bit_state"),
    "fused_amp[8-bit state, stochastic]": (dict(state_dtype=torch.uint8, stochastic_rounding=True,
                                               rounding_seed=0), "adam_8bit_state"),
    "fused_amp[remainder + 8-bit state]": (dict(master_weights="remainder", state_dtype=torch.uint8),
                                           "adam_remainder_8bit_state"),
    "fused_amp[24-bit masters]": (dict(master_weights="remainder8", rounding_seed=0), "adam_24bit"),
    "fused_amp[24-bit masters + 8-bit state]": (dict(master_weights="remainder8", state_dtype=torch.uint8,
                                                     rounding_seed=0), "adam_24bit_8bit_state"),
    "fused_amp[fp32 params]": ({}, "adam"),
}
# The outside anchors with 8-bit state, where installed (requirements-bench.txt): their Adam on
# fp32 params (they keep no masters) under torch's GradScaler, as a user of theirs would run it.
def _bnb_adam8bit(params):
    from bitsandbytes.optim import Adam8bit
    return Adam8bit(params, lr=1e-3)


def _torchao_adam8bit(params):
    from torchao.optim import AdamW8bit
    return AdamW8bit(params, lr=1e-3, weight_decay=0.0)


OUTSIDE = {"bitsandbytes[Adam8bit]": ("bitsandbytes", _bnb_adam8bit),
           "torchao[AdamW8bit]": ("torchao", _torchao_adam8bit)}


def _installed(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False
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
    values, grads = impls.random_values(shapes, ctx.device)
    steps = {}
    for name, (options, _) in MODES.items():
        dtype = torch.float32 if name.endswith("[fp32 params]") else torch.bfloat16
        params, pristine = impls.params_with_grads(values, grads, dtype)
        steps[name] = (impls.fused_amp_step(params, "adam", ctx.device, **options), pristine)
    params, pristine = impls.params_with_grads(values, grads, torch.float32)  # the same data
    steps["torch_amp"] = (impls.torch_amp_step(params, "adam", ctx.device), pristine)
    for name, (module, make) in OUTSIDE.items():
        if ctx.quick:  # torchao compiles its step first: tens of seconds
            ctx.skip("memory", name, "full runs only")
            continue
        if not _installed(module):
            ctx.skip("memory", name, f"{module} is not installed (optional: pip install -r requirements-bench.txt)")
            continue
        params, pristine = impls.params_with_grads(values, grads, torch.float32)
        steps[name] = (impls.ScalerStep(params, make(params), torch.amp.GradScaler, ctx.device), pristine)
    timed = [harness.Impl(name, step.step, (lambda s=step, p=pristine: impls.refresh_grads(s, p)))
             for name, (step, pristine) in steps.items()]
    times = harness.time_alternating(timed, ctx.device, ctx.reps)
    n = workloads.n_params(shapes)
    extra = {name: {"state_bytes": harness.tensor_bytes(t for s in step.optimizer.state.values()
                                                        for k, t in s.items() if k != "step")}
             for name, (step, _) in steps.items()}
    records = harness.make_records("memory", f"adam/bfloat16/{n // 1_000_000}M/modes", ctx.device,
                                   "bfloat16", n, len(shapes), times, ctx.ceiling_gbps, None, extra)
    for rec in records:  # each mode at its own bytes
        name = rec["impl"]
        grad_dtype = "float32" if name in ("torch_amp", "fused_amp[fp32 params]") or name in OUTSIDE else "bfloat16"
        op = MODES[name][1] if name in MODES else ("adam_8bit_state" if name in OUTSIDE else "adam")
        rec["bytes_per_param"] = bytes_per_param(op, grad_dtype) + 2 * (4 if grad_dtype == "float32" else 2)
        rec["gbytes_per_s"] = rec["bytes_per_param"] * n / (rec["time_ms"] / 1e3) / 1e9
        rec["ceiling_frac"] = rec["gbytes_per_s"] / ctx.ceiling_gbps if ctx.ceiling_gbps else None
    return records


def run_convergence(ctx):
    """Final held-out loss per mode (mean of 3 seeds; loss_seeds and loss_spread beside it), and
    the seconds per training step (the first repeat's: later repeats report the same runs)."""
    modes = [m for m in convergence.MODES if convergence.available(m)]
    for m in convergence.MODES:
        if m not in modes:
            ctx.skip("memory", f"charlm/convergence {m}",
                     f"{convergence.OPTIONAL[m]} is not installed (optional: pip install -r requirements-bench.txt)")
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
