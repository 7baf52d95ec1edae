"""results.json, results.md, the PNG plots and the terminal summary."""
import json
import math
import os
import statistics
from collections import defaultdict
from typing import Dict, List, Optional

from benchmarks import workloads
from benchmarks.impls import FUSED_AMP_SETTINGS
from benchmarks.roofline import BYTES_PER_PARAM, RECIPE_BYTES_ADAM


# fields of a case's records that each repeat measures, reported by the median of the repeats
PER_RUN_MEDIANS = ("outside_ns_frac", "host_us_per_param", "host_cpu_us_per_param")


def aggregate(runs: List[Dict], ceiling_gbps: Optional[float]) -> List[Dict]:
    """One record per (suite, case, impl) from the records of every repeat: the median of the
    repeats' median times and their range, the speedups' median and range, and the fraction
    of the ceiling (the best over all repeats) at the median time. With a single repeat the
    ranges are those of the repetitions within it (ratios: of the repetitions timed in turn)."""
    groups = defaultdict(list)
    for r in runs:
        groups[(r["suite"], r["case"], r["impl"])].append(r)
    out = []
    for rs in groups.values():
        rec = {k: v for k, v in rs[0].items() if k != "repeat"}
        times = [r["time_ms"] for r in rs]
        t = statistics.median(times)
        rec.update(time_ms=t, repeats=len(rs), gparams_per_s=rec["n_params"] / t * 1e3 / 1e9)
        if len(rs) > 1:
            rec.update(time_ms_min=min(times), time_ms_max=max(times))
        if rec["bytes_per_param"] and ceiling_gbps:
            rec["gbytes_per_s"] = rec["bytes_per_param"] * rec["n_params"] / t * 1e3 / 1e9
            rec["ceiling_frac"] = rec["gbytes_per_s"] / ceiling_gbps
        for key in PER_RUN_MEDIANS:
            if rec.get(key) is not None:
                rec[key] = statistics.median(r[key] for r in rs)
        if len(rs) > 1:  # else the range of the paired repetitions of the one run stays
            ratios = {o: [r["speedup_vs"][o] for r in rs] for o in rs[0]["speedup_vs"]}
            rec["speedup_vs"] = {o: statistics.median(v) for o, v in ratios.items()}
            rec["speedup_range"] = {o: [min(v), max(v)] for o, v in ratios.items()}
        out.append(rec)
    return out


def over_ceiling(records: List[Dict]) -> List[str]:
    """The results that moved more bytes per second than the ceiling: the ceiling is wrong."""
    return [f"{r['suite']} {r['case']} {r['impl']} ({r['gbytes_per_s']:.1f} GB/s)"
            for r in records if r["ceiling_frac"] is not None and r["ceiling_frac"] > 1.0]


def _frac(r) -> str:
    if r["ceiling_frac"] is None:
        return "–"
    if r["ceiling_frac"] > 1.0:
        return "above the ceiling (the ceiling is wrong)"
    return f"{r['ceiling_frac'] * 100:.0f}%"


def verdict(low: float, high: float) -> str:
    """faster / slower only when every repeat agrees."""
    if low > 1.0:
        return "faster"
    if high < 1.0:
        return "SLOWER"
    return "within noise"


def _fmt(value, digits=2):
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(records: List[Dict], suite: str) -> str:
    """One table per suite: a row per (case, impl)."""
    rows = [r for r in records if r["suite"] == suite]
    if not rows:
        return ""
    others = sorted({o for r in rows for o in r["speedup_vs"]})
    head = ["case", "impl", "time ms (range)", "Gparam/s", "GB/s", "of ceiling"]
    head += [f"× vs {o}" for o in others]
    extra = [k for k in ("loss", "loss_spread", "tokens_per_s", "host_syncs_per_step", "peak_mem_bytes",
                         "state_bytes", "outside_ns_frac")
             if any(r.get(k) is not None for r in rows)]
    head += extra
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["case"], r["impl"],
                 f"{r['time_ms']:.2f} ({r['time_ms_min']:.2f}–{r['time_ms_max']:.2f})",
                 _fmt(r["gparams_per_s"], 3), _fmt(r["gbytes_per_s"], 1), _frac(r)]
        cells += [f"{r['speedup_vs'][o]:.2f} ({r['speedup_range'][o][0]:.2f}–{r['speedup_range'][o][1]:.2f})"
                  if o in r["speedup_vs"] else "–" for o in others]
        for k in extra:
            v = r.get(k)
            if v is not None and k.endswith("bytes"):
                cells.append(_fmt(v / 2 ** 20, 0) + " MiB")
            elif v is not None and k.endswith("_frac"):
                cells.append(f"{v:.1%}")
            else:
                cells.append(_fmt(v, 4 if k.startswith("loss") else 0))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_lines(records: List[Dict]) -> List[str]:
    """fused_amp against each other implementation, per case: median ratio, its range over the
    repeats, and a verdict only where every repeat agrees."""
    out = []
    for r in records:
        if r["impl"] != "fused_amp" or not r["speedup_vs"]:
            continue
        parts = []
        for other in sorted(r["speedup_vs"]):
            low, high = r["speedup_range"][other]
            parts.append(f"{r['speedup_vs'][other]:.2f}x ({low:.2f}–{high:.2f}) vs {other}: "
                         f"{verdict(low, high)}")
        out.append(f"{r['suite']:>9} {r['case']:<28} {r['time_ms']:9.2f} ms  " + "; ".join(parts)
                   + f"; {_frac(r)} of ceiling")
    return out


def user_lines(records: List[Dict], machine: Dict, repeat: int,
               model_params: Optional[int] = None) -> List[str]:
    """The user's question first: for the model size measured, the step time and the memory of
    fused_amp against torch's AMP recipe and the hand-written master recipe; with
    ``model_params``, the same predicted for that size from the scaling fit."""
    mains = [r for r in records if r["suite"] == "optimizer" and r["case"].startswith("adam/")
             and "-x-" not in r["case"] and not r["case"].endswith("/clip")]
    if not mains:  # (a run of other suites: the FSDP2 prediction needs only the distributed one)
        return fsdp_prediction(records, model_params) if model_params else []
    case = next((r["case"] for r in mains if "bfloat16" in r["case"]), mains[0]["case"])
    rows = {r["impl"]: r for r in mains if r["case"] == case}
    isa = machine["fused_amp_build"].get("cpu_isa")
    where = machine.get("gpu") or f"{machine['cpu']} ({isa}, {machine['threads']} threads)"
    n = next(iter(rows.values()))["n_params"]
    out = [f"Adam step with GradScaler, {n / 1e6:.0f}M params, {case.split('/')[1]} (fp32 for torch_amp), "
           f"on {where}, torch {machine['torch']}; median of {repeat} run(s):",
           f"  {'':<13} {'step time (range)':<24} {'moves':<13} holds (params, grads, optimizer state)"]
    for impl in ("fused_amp", "torch_amp", "torch_master"):
        r = rows.get(impl)
        if r is None:
            continue
        held = r.get("state_bytes")
        held_text = f"{held / 2 ** 30:.2f} GiB ({held / n:.1f} B/param)" if held else "–"
        out.append(f"  {impl:<13} {r['time_ms']:8.1f} ms ({r['time_ms_min']:.1f}–{r['time_ms_max']:.1f})"
                   f"{'':<3} {RECIPE_BYTES_ADAM[impl]:>3} B/param  {held_text}")
    ours = rows.get("fused_amp")
    if ours:
        out.append("  fused_amp: " + "; ".join(
            f"{ours['speedup_vs'][o]:.2f}x ({lo:.2f}–{hi:.2f}) vs {o}, {verdict(lo, hi)}"
            for o, (lo, hi) in sorted(ours["speedup_range"].items())))
    clipped = {r["impl"]: r for r in records if r["suite"] == "optimizer" and r["case"] == case + "/clip"}
    if ours and "fused_amp" in clipped:
        c = clipped["fused_amp"]
        out.append(f"  with clipping (max_norm 1.0): fused_amp {c['time_ms']:.1f} ms, "
                   f"{c['time_ms'] / ours['time_ms']:.2f}x its step without; " + "; ".join(
                       f"{c['speedup_vs'][o]:.2f}x ({lo:.2f}–{hi:.2f}) vs {o}, {verdict(lo, hi)}"
                       for o, (lo, hi) in sorted(c["speedup_range"].items())))
    fits = scaling_fit(records)
    if model_params and fits:
        predicted = []
        for impl, r in rows.items():
            fit = fits.get(impl, {})
            if "ns_per_param" in fit and r.get("state_bytes"):
                t = fit["overhead_ms"] + fit["ns_per_param"] * model_params / 1e6
                held = r["state_bytes"] / n * model_params
                predicted.append(f"{impl} {t:.1f} ms, holds {held / 2 ** 30:.2f} GiB")
        if predicted:
            out.append(f"  predicted for {model_params / 1e6:.0f}M params (scaling fit of this run): "
                       + "; ".join(predicted))
    if model_params:
        out += fsdp_prediction(records, model_params)
    return out


def fsdp_prediction(records: List[Dict], model_params: int, ranks: int = 8,
                    ceiling_gbps: Optional[float] = None) -> List[str]:
    """The optimizer step of a Llama-shaped model of ``model_params`` params under FSDP2 on
    ``ranks`` ranks, from the fsdp2-host case (host time per param tensor, each rank steps the
    shards of every tensor) and the ceiling (the kernels' time at the roofline's 28 B/param of
    Adam for the rank's shard). On a GPU the launches run ahead of the kernels, so the step takes
    the longer of the two; the host time is this machine's Python, in CPU time of the stepping
    thread where the case recorded it (a GPU's host does not wait in the flag's all-reduce)."""
    rows = [r for r in records
            if r["suite"] == "distributed" and r["case"].startswith("fsdp2-host") and "host_us_per_param" in r]
    cpu = all("host_cpu_us_per_param" in r for r in rows)
    host = {r["impl"]: r["host_cpu_us_per_param" if cpu else "host_us_per_param"] for r in rows}
    if "fused_amp" not in host or "torch_fused" not in host:
        return []
    ceiling_gbps = ceiling_gbps or next((r["gbytes_per_s"] / r["ceiling_frac"] for r in records
                                         if r.get("ceiling_frac")), None)
    tensors = workloads.llama_like_tensor_count(model_params)
    line = (f"  FSDP2, {model_params / 1e9:.1f}B params (a Llama-like {tensors} tensors) on {ranks} ranks: "
            f"host time per rank per step fused_amp {tensors * host['fused_amp'] / 1e3:.1f} ms, torch's fused "
            f"AdamW {tensors * host['torch_fused'] / 1e3:.1f} ms (fsdp2-host: {host['fused_amp']:.1f} and "
            f"{host['torch_fused']:.1f} us per tensor"
            f"{' of CPU time' if cpu else ''})")
    if ceiling_gbps:
        kernels_ms = 28 * model_params / ranks / (ceiling_gbps * 1e9) * 1e3
        line += f"; kernels at this run's ceiling ({ceiling_gbps:.0f} GB/s): {kernels_ms:.1f} ms"
    return [line]


def _relative_fit(points):
    """(a, b) minimising the relative error of t = a + b x: weights 1/t^2, so that the small
    cases, which show the fixed overhead, count as much as the large ones."""
    w = [1.0 / t ** 2 for _, t in points]
    sw = sum(w)
    mx = sum(wi * x for wi, (x, _) in zip(w, points)) / sw
    my = sum(wi * t for wi, (_, t) in zip(w, points)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, (x, _) in zip(w, points))
    b = sum(wi * (x - mx) * (t - my) for wi, (x, t) in zip(w, points)) / sxx if sxx else 0.0
    return my - b * mx, b


def scaling_fit(records: List[Dict]) -> Dict[str, Dict[str, float]]:
    """Per impl: step time = overhead + slope * n_params over the params/ cases, and
    time = overhead + per_tensor * n_tensors over the tensors/ cases (tensors of 1,000)."""
    fits = defaultdict(dict)
    for prefix, xkey in (("params/", "n_params"), ("tensors/", "n_tensors")):
        by_impl = defaultdict(list)
        for r in records:
            if r["suite"] == "scaling" and r["case"].startswith(prefix):
                by_impl[r["impl"]].append((r[xkey], r["time_ms"]))
        for impl, pts in by_impl.items():
            if len(pts) < 2:
                continue
            a, b = _relative_fit(pts)
            if prefix == "params/":
                fits[impl].update(overhead_ms=a, ns_per_param=b * 1e6)
            else:
                fits[impl].update(us_per_tensor=b * 1e3)
    return dict(fits)


def write_markdown(path: str, machine: Dict, ceiling: Dict, records: List[Dict], repeat: int = 1,
                   skipped: Optional[List[Dict]] = None, model_params: Optional[int] = None,
                   notes: Optional[Dict[str, str]] = None) -> None:
    parts = ["# fused_amp benchmark results", "", "```", *user_lines(records, machine, repeat, model_params),
             "```", "",
             f"Machine: {machine.get('gpu') or machine['cpu']} ({machine['threads']} threads), "
             f"torch {machine['torch']}, {machine['date']}; fused_amp build "
             f"{json.dumps(machine['fused_amp_build'])}.", "",
             "Bandwidth ceiling measured in this run: " + ", ".join(f"{k} {v:.1f}" for k, v in ceiling.items()) + " GB/s.",
             "GB/s and 'of ceiling' credit every implementation with the roofline bytes of the operation "
             "(../shared/DESIGN.md): " + ", ".join(f"{op} {dt} {b} B/param" for (op, dt), b in BYTES_PER_PARAM.items()) + ".",
             "fused_amp's optimizers run with " + ", ".join(f"{k}={v}" for k, v in FUSED_AMP_SETTINGS.items())
             + ": p.grad is left unscaled after the step, as torch's fused optimizers leave it (2 bytes/param "
             "for half grads beyond the roofline, written by torch_amp's fused optimizer too).",
             f"The whole plan ran {repeat} time(s), implementations timed in turns (A B C A B C ...) "
             "within each: times are the median of the runs' medians with their range "
             + ("over the runs" if repeat > 1 else "over the repetitions") + "; ratios likewise. "
             "A case is called faster or slower only when every run agrees.", ""]
    if over_ceiling(records):
        parts += ["**The ceiling is wrong:** " + ", ".join(over_ceiling(records)) + " moved more than it.", ""]
    if skipped:
        parts += ["Skipped: " + "; ".join(f"{s['suite']} {s['case']} ({s['reason']})" for s in skipped), ""]
    parts += [f"{suite}: {text}" for suite, text in (notes or {}).items()] + ([""] if notes else [])
    for suite in ("unscale", "optimizer", "memory", "muon", "train", "scaling", "distributed"):
        table = markdown_table(records, suite)
        if table:
            parts += [f"## {suite}", "", table, ""]
    fits = scaling_fit(records)
    if fits:
        parts += ["Scaling fit, step time = overhead + slope × params (relative least squares), and the cost "
                  "of each further tensor of 1,000 elements: " + "; ".join(
                      f"{k}: {v.get('overhead_ms', math.nan):.2f} ms + {v.get('ns_per_param', math.nan):.3f} ns/param, "
                      f"{v.get('us_per_tensor', math.nan):.2f} µs/tensor" for k, v in fits.items()), ""]
    parts += ["## Summary (fused_amp)", "", "```", *summary_lines(records), "```", ""]
    with open(path, "w") as f:
        f.write("\n".join(parts))


def write_plots(out_dir: str, records: List[Dict]) -> List[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    ours = [r for r in records if r["impl"] == "fused_amp" and r["suite"] != "scaling" and r["speedup_vs"]]
    if ours:
        others = sorted({o for r in ours for o in r["speedup_vs"]})
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(ours)), 4.5))
        width = 0.8 / len(others)
        for i, other in enumerate(others):
            xs = [j + i * width for j in range(len(ours))]
            ax.bar(xs, [r["speedup_vs"].get(other, math.nan) for r in ours], width, label=f"vs {other}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ours))])
        ax.set_xticklabels([f"{r['suite']}\n{r['case']}" for r in ours], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("speedup of fused_amp (×)")
        ax.legend()
        fig.tight_layout()
        written.append(_save(fig, out_dir, "speedup.png"))
    with_frac = [r for r in records if r["ceiling_frac"] is not None and r["suite"] != "scaling"]
    if with_frac:
        impls = sorted({r["impl"] for r in with_frac})
        cases = sorted({(r["suite"], r["case"]) for r in with_frac})
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(cases)), 4.5))
        width = 0.8 / len(impls)
        for i, impl in enumerate(impls):
            frac = {(r["suite"], r["case"]): r["ceiling_frac"] for r in with_frac if r["impl"] == impl}
            ax.bar([j + i * width for j in range(len(cases))], [frac.get(c, math.nan) for c in cases], width, label=impl)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))])
        ax.set_xticklabels([f"{s}\n{c}" for s, c in cases], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("fraction of the bandwidth ceiling")
        ax.legend()
        fig.tight_layout()
        written.append(_save(fig, out_dir, "ceiling_fraction.png"))
    scaling = [r for r in records if r["suite"] == "scaling"]
    if scaling:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        for ax, prefix, xkey, xlabel in ((axes[0], "params/", "n_params", "parameters"),
                                         (axes[1], "tensors/", "n_tensors", "tensors of 1,000 elements")):
            for impl in sorted({r["impl"] for r in scaling}):
                pts = sorted((r[xkey], r["time_ms"]) for r in scaling if r["impl"] == impl and r["case"].startswith(prefix))
                if pts:
                    ax.loglog([p for p, _ in pts], [t for _, t in pts], marker="o", label=impl)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("Adam step (ms)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.tight_layout()
        written.append(_save(fig, out_dir, "scaling.png"))
    return written


def _save(fig, out_dir, name):
    import matplotlib.pyplot as plt
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
