"""results.json, results.md, the PNG plots and the terminal summary."""
import json
import math
import os
from collections import defaultdict
from typing import Dict, List

from benchmarks.impls import FUSED_AMP_SETTINGS
from benchmarks.roofline import BYTES_PER_PARAM


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
    head = ["case", "impl", "time ms (min–max)", "Gparam/s", "GB/s", "of ceiling"]
    head += [f"× vs {o}" for o in others]
    extra = [k for k in ("loss", "tokens_per_s", "host_syncs_per_step", "peak_mem_bytes", "state_bytes")
             if any(r.get(k) is not None for r in rows)]
    head += extra
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["case"], r["impl"],
                 f"{r['time_ms']:.2f} ({r['time_ms_min']:.2f}–{r['time_ms_max']:.2f})",
                 _fmt(r["gparams_per_s"], 3), _fmt(r["gbytes_per_s"], 1),
                 _fmt(r["ceiling_frac"] * 100, 0) + "%" if r["ceiling_frac"] is not None else "–"]
        cells += [_fmt(r["speedup_vs"].get(o)) for o in others]
        for k in extra:
            v = r.get(k)
            cells.append(_fmt(v / 2 ** 20, 0) + " MiB" if k.endswith("bytes") and v is not None
                         else _fmt(v, 4 if k == "loss" else 0))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_lines(records: List[Dict]) -> List[str]:
    """fused_amp against each other implementation, per case: where it wins and where it loses."""
    out = []
    for r in records:
        if r["impl"] != "fused_amp" or not r["speedup_vs"]:
            continue
        ratios = ", ".join(f"{v:.2f}x vs {k}" for k, v in sorted(r["speedup_vs"].items()))
        frac = f", {r['ceiling_frac'] * 100:.0f}% of ceiling" if r["ceiling_frac"] is not None else ""
        loses = [k for k, v in r["speedup_vs"].items() if v < 1.0]
        verdict = f"  SLOWER than {', '.join(loses)}" if loses else ""
        out.append(f"{r['suite']:>9} {r['case']:<28} {r['time_ms']:9.2f} ms  {ratios}{frac}{verdict}")
    return out


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


def write_markdown(path: str, machine: Dict, ceiling: Dict, records: List[Dict]) -> None:
    parts = ["# fused_amp benchmark results", "",
             f"Machine: {machine.get('gpu') or machine['cpu']} ({machine['threads']} threads), "
             f"torch {machine['torch']}, {machine['date']}; fused_amp build "
             f"{json.dumps(machine['fused_amp_build'])}.", "",
             "Bandwidth ceiling measured in this run: " + ", ".join(f"{k} {v:.1f}" for k, v in ceiling.items()) + " GB/s.",
             "GB/s and 'of ceiling' credit every implementation with the roofline bytes of the operation "
             "(../shared/DESIGN.md): " + ", ".join(f"{op} {dt} {b} B/param" for (op, dt), b in BYTES_PER_PARAM.items()) + ".",
             "fused_amp's optimizers run with " + ", ".join(f"{k}={v}" for k, v in FUSED_AMP_SETTINGS.items())
             + ": p.grad is left unscaled after the step, as torch's fused optimizers leave it (2 bytes/param "
             "for half grads beyond the roofline, written by torch_amp's fused optimizer too).",
             "Times are medians over the repetitions, implementations timed in turns (A B C A B C ...).", ""]
    for suite in ("unscale", "optimizer", "train", "scaling"):
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
