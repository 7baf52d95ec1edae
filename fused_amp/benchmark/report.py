"""results.md, the PNG plots and the terminal summary, from the records of results.json."""
import json
import math
import os
import statistics
from collections import defaultdict
from typing import Dict, List, Optional, Sequence

from fused_amp.benchmark import recipes, workloads
from fused_amp.benchmark.impls import FUSED_AMP_SETTINGS


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
            common = set.intersection(*(set(r["speedup_vs"]) for r in rs))  # (timed in turns in every run)
            ratios = {o: [r["speedup_vs"][o] for r in rs] for o in sorted(common)}
            rec["speedup_vs"] = {o: statistics.median(v) for o, v in ratios.items()}
            rec["speedup_range"] = {o: [min(v), max(v)] for o, v in ratios.items()}
        out.append(rec)
    return out


def over_ceiling(records: List[Dict]) -> List[str]:
    """The results that moved more bytes per second than the ceiling: the ceiling is wrong."""
    return [f"{r['suite']} {r['case']} {r['impl']} ({r['gbytes_per_s']:.1f} GB/s)"
            for r in records if r["ceiling_frac"] is not None and r["ceiling_frac"] > 1.0]


def _frac(r, short: bool = False) -> str:
    if r["ceiling_frac"] is None:
        return "–"
    if r["ceiling_frac"] > 1.0:
        return "ceiling wrong" if short else "above the ceiling (the ceiling is wrong)"
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


# torch's recipe in a case: its AMP recipe, or (distributed) its fused Adam on the same shards, or
# (unscale) its own unscale
TORCH_REFS = ("torch_amp", "torch_fused", "torch")
ANCHOR_PREFIXES = ("bitsandbytes", "torchao", "deepspeed", "torch-optimi")
MAX_COLUMNS = 10  # a table a person reads; the rest of a record is in results.json
# the measurements beyond time that a suite's table shows where its records have them, in order
EXTRA_COLUMNS = {"loss": ("loss", 4), "loss_spread": ("loss spread", 4), "tokens_per_s": ("tokens/s", 0),
                 "host_us_per_param": ("host µs/param", 2), "host_syncs_per_step": ("host syncs", 0),
                 "peak_mem_bytes": ("peak MiB", 0), "outside_ns_frac": ("outside NS", 1)}


def reference(rows: List[Dict]) -> Optional[str]:
    """torch's recipe among the implementations of one case."""
    impls = {r["impl"] for r in rows}
    return next((t for t in TORCH_REFS if t in impls), None)


def best_anchor(rows: List[Dict]) -> Optional[str]:
    """The fastest outside anchor among the implementations of one case."""
    anchors = [r for r in rows if r["impl"].startswith(ANCHOR_PREFIXES)]
    return min(anchors, key=lambda r: r["time_ms"])["impl"] if anchors else None


def ratio(r: Dict, other: Optional[str]) -> str:
    """How many times faster ``r`` is than ``other``, with the range over the runs."""
    if other is None or other not in r["speedup_vs"]:
        return "–"
    low, high = r["speedup_range"][other]
    return f"{r['speedup_vs'][other]:.2f}× ({low:.2f}–{high:.2f})"


def ms(t: float) -> str:
    """A time in ms: two decimals, or three significant digits below 1 ms (a one-param step
    takes some microseconds, which two decimals would round to 0.01)."""
    return f"{t:.2f}" if t >= 1 else f"{t:.3g}"


def holds(r: Dict) -> str:
    return f"{r['held_bytes'] / r['n_params']:.1f}" if r.get("held_bytes") else "–"


def _cases(records: List[Dict], suite: str) -> Dict[str, List[Dict]]:
    out = defaultdict(list)
    for r in records:
        if r["suite"] == suite:
            out[r["case"]].append(r)
    return out


def suite_table(records: List[Dict], suite: str) -> List[List[str]]:
    """One table per suite, a row per (case, impl): the header row first. The ratios are against
    torch's recipe and the best outside anchor of each case only; at most MAX_COLUMNS columns; no
    case column where the suite has one case."""
    cases = _cases(records, suite)
    rows = [r for case in cases.values() for r in case]
    if not rows:
        return []
    anchors = any(best_anchor(case) for case in cases.values())
    one = len(cases) == 1  # then the case is said above the table, not in each row
    head = ([] if one else ["case"]) + ["impl", "time ms (range)", "× torch (range)"]
    head += ["× best anchor"] if anchors else []
    head += ["of ceiling", "holds B/param"]
    extra = [k for k in EXTRA_COLUMNS if any(r.get(k) is not None for r in rows)][:MAX_COLUMNS - len(head)]
    table = [head + [EXTRA_COLUMNS[k][0] for k in extra]]
    for case in cases.values():
        ref, anchor = reference(case), best_anchor(case)
        for r in case:
            cells = ([] if one else [r["case"]]) + [r["impl"], f"{ms(r['time_ms'])} ({ms(r['time_ms_min'])}–{ms(r['time_ms_max'])})",
                     ratio(r, ref)] + ([ratio(r, anchor)] if anchors else []) + [_frac(r, short=True), holds(r)]
            for k in extra:
                v = r.get(k)
                if v is not None and k.endswith("_bytes"):
                    v = v / 2 ** 20
                cells.append(f"{v:.1%}" if v is not None and k.endswith("_frac") else _fmt(v, EXTRA_COLUMNS[k][1]))
            table.append(cells)
    return table


def markdown(table: List[List[str]]) -> str:
    lines = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in table[1:]])


def text(table: List[List[str]], indent: str = "  ") -> List[str]:
    """A table in fixed-width columns for the terminal: text left, numbers right."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    right = [all(_numeric(row[i]) for row in table[1:]) for i in range(len(widths))]
    return [indent + "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right)).rstrip()
            for row in table]


def _numeric(cell: str) -> bool:
    return cell[:1].isdigit() or cell in ("–", "ceiling wrong")


def verdict_lines(records: List[Dict]) -> List[str]:
    """Per case, fused_amp against torch's recipe and the best outside anchor: the ratio, its
    range over the runs, and faster or slower only where every run agrees."""
    out = []
    for suite in SUITE_ORDER:
        for case, rows in _cases(records, suite).items():
            ours = next((r for r in rows if r["impl"] == "fused_amp"), None)
            parts = []
            for other in (reference(rows), best_anchor(rows)):
                if ours and other in ours["speedup_vs"]:
                    low, high = ours["speedup_range"][other]
                    parts.append(f"{ratio(ours, other)} vs {other}: {verdict(low, high)}")
            if parts:
                out.append(f"{suite:>11} {case:<28} {ms(ours['time_ms']):>9} ms  " + "; ".join(parts)
                           + f"; {_frac(ours)} of ceiling")
    return out


SUITE_ORDER = ("model", "unscale", "optimizer", "memory", "muon", "train", "scaling", "distributed", "offload")


def summary_case(records: List[Dict]) -> List[Dict]:
    """The rows the summary shows, one per recipe: the user's model, else the memory suite's
    modes, else the optimizer suite's Adam step on bf16 params."""
    for suite, pick in (("model", lambda c: True), ("memory", lambda c: c.endswith("/modes")),
                        ("optimizer", lambda c: c.startswith("adam/bfloat16/") and c.endswith("M"))):
        for case, rows in _cases(records, suite).items():
            if pick(case):
                return rows
    return []


def _memory_of(machine: Dict) -> Optional[int]:
    return machine.get("gpu_memory_bytes") or machine.get("memory_bytes")


def pick_lines(rows: List[Dict], machine: Dict) -> List[str]:
    """Which recipe to pick for the user's model, among fused_amp's that keep every update (exact
    masters) and whose weights, grads and state fit in half of the device's memory (the other
    half for activations): the fastest with fp32 state (the numerics of torch's Adam), else the
    fastest with smaller state; and the one that holds least."""
    memory = _memory_of(machine)
    exact = [r for r in rows if r["impl"].startswith("fused_amp") and r.get("held_bytes")
             and recipes.MASTERS.get(r.get("masters"), False)]
    if not memory or not exact:
        return []
    fits = [r for r in exact if r["held_bytes"] <= memory / 2]
    least = min(exact, key=lambda r: r["held_bytes"])
    head = f"pick ({memory / 2 ** 30:.0f} GiB on this device, half of it left for activations):"
    if not fits:
        return [head, f"  no recipe with exact masters fits; the least, {least['impl']}, holds "
                f"{least['held_bytes'] / 2 ** 30:.1f} GiB: shard with FSDP2 or release the grads in "
                "backward (fused_amp.optim.step_in_backward)"]
    ref = reference(rows)

    def said(r):
        speed = f", {r['speedup_vs'][ref]:.2f}× torch's speed" if ref in r["speedup_vs"] else ""
        return f"{r['impl']} ({holds(r)} B/param{speed})"
    fp32_state = [r for r in fits if r.get("state") == "fp32"]
    best = min(fp32_state or fits, key=lambda r: r["time_ms"])
    out = [head, f"  the fastest with exact masters{' and fp32 state' if fp32_state else ''}: {said(best)}"]
    if least is not best:
        out.append(f"  the least memory with exact masters: {said(least)}")
    return out


def summary_parts(records: List[Dict], machine: Dict, repeat: int, model_params: Optional[int] = None):
    """What a user reads first, as (lines before, table, lines after): one row per recipe for the
    model measured (theirs with --model): step time, its ratio to torch's recipe, the bytes it
    holds per param and in all, and the fraction of the ceiling; then which recipe to pick for
    their model, and with ``model_params`` the step predicted for that size from the scaling fit."""
    rows = summary_case(records)
    if not rows:  # (a run of other suites: the FSDP2 prediction needs only the distributed one)
        return [], [], fsdp_prediction(records, model_params) if model_params else []
    first = rows[0]
    n = first["n_params"]
    isa = machine["fused_amp_build"].get("cpu_isa")
    where = machine.get("gpu") or f"{machine['cpu']} ({isa}, {machine['threads']} threads)"
    if first["suite"] == "model":
        what, step = f"Your model ({first['case'].rsplit('/', 1)[0]})", "AdamW"
    else:
        what, step = first["case"], "Adam"
    out = [f"{what}: {n / 1e6:.1f}M params in {first['n_tensors']} tensors.",
           f"One {step} step with a GradScaler (scaler step + update) on {where}, torch {machine['torch']};",
           f"median of {repeat} run(s), range over the {'runs' if repeat > 1 else 'repetitions'}:"]
    ref = reference(rows)
    table = [["recipe", "masters", "state", "step ms (range)", "× torch (range)", "holds B/param", "holds GiB",
              "of ceiling"]]
    for r in sorted(rows, key=lambda r: r["impl"] != ref):  # torch's first, then as measured
        table.append([r["impl"], r.get("masters") or "–", r.get("state") or "–",
                      f"{r['time_ms']:.1f} ({r['time_ms_min']:.1f}–{r['time_ms_max']:.1f})",
                      ratio(r, ref) if r["impl"] != ref else "–", holds(r),
                      f"{r['held_bytes'] / 2 ** 30:.2f}" if r.get("held_bytes") else "–", _frac(r, short=True)])
    after = pick_lines(rows, machine) if first["suite"] == "model" else []
    fits = scaling_fit(records)
    if model_params and fits:
        predicted = []
        for r in rows:
            fit = fits.get(r["impl"], {})
            if "ns_per_param" in fit and r.get("held_bytes"):
                t = fit["overhead_ms"] + fit["ns_per_param"] * model_params / 1e6
                predicted.append(f"{r['impl']} {t:.1f} ms, holds {r['held_bytes'] / n * model_params / 2 ** 30:.2f} GiB")
        if predicted:
            after.append(f"predicted for {model_params / 1e6:.0f}M params (scaling fit of this run): "
                       + "; ".join(predicted))
    if model_params:
        after += fsdp_prediction(records, model_params)
    return out, table, after


def summary(records: List[Dict], machine: Dict, repeat: int, model_params: Optional[int] = None) -> List[str]:
    """The summary as the terminal prints it."""
    before, table, after = summary_parts(records, machine, repeat, model_params)
    return before + (text(table) if table else []) + after


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
                   notes: Optional[Dict[str, str]] = None, plots: Sequence[str] = ()) -> None:
    """results.md: the summary first, then one table per suite, then how it was measured."""
    where = machine.get("gpu") or machine["cpu"]
    before, table, after = summary_parts(records, machine, repeat, model_params)
    parts = [f"# fused_amp benchmark: {where}, {machine['date'][:10]}", "", " ".join(before), ""]
    if table:
        parts += [markdown(table), ""]
    # the pick's head line as a paragraph, its indented lines as a list
    for line in after:
        parts += [f"- {line.strip()}"] if line.startswith("  ") else [line, ""]
    parts += [""] if after else []
    if over_ceiling(records):
        parts += ["**The ceiling is wrong:** " + ", ".join(over_ceiling(records)) + " moved more than it.", ""]
    for suite in SUITE_ORDER:
        table = suite_table(records, suite)
        if table:
            cases = list(_cases(records, suite))
            parts += [f"## {suite}", ""] + ([f"Case `{cases[0]}`.", ""] if len(cases) == 1 else [])
            parts += [markdown(table), ""]
            if suite in (notes or {}):
                parts += [notes[suite], ""]
    fits = scaling_fit(records)
    if fits:
        parts += ["Scaling fit, step time = overhead + slope × params (relative least squares), and the cost "
                  "of each further tensor of 1,000 elements: " + "; ".join(
                      f"{k}: {v.get('overhead_ms', math.nan):.2f} ms + {v.get('ns_per_param', math.nan):.3f} ns/param, "
                      f"{v.get('us_per_tensor', math.nan):.2f} µs/tensor" for k, v in fits.items()), ""]
    if plots:
        parts += ["Plots: " + ", ".join(f"[{os.path.basename(p)}]({os.path.basename(p)})" for p in plots), ""]
    parts += ["## How this was measured", "",
              f"Machine: {where} ({machine['threads']} threads), torch {machine['torch']}, {machine['date']}; "
              f"fused_amp build {json.dumps(machine['fused_amp_build'])}.", "",
              "Bandwidth ceiling measured in this run: " + ", ".join(f"{k} {v:.1f}" for k, v in ceiling.items())
              + " GB/s. 'of ceiling' credits every implementation with the roofline bytes of its operation "
              "(roofline.py; every ratio, GB/s and the other fields are in results.json).", "",
              "fused_amp's optimizers run with " + ", ".join(f"{k}={v}" for k, v in FUSED_AMP_SETTINGS.items())
              + ": p.grad is left unscaled after the step, as torch's fused optimizers leave it.", "",
              f"The whole plan ran {repeat} time(s), implementations timed in turns (A B C A B C ...) within each: "
              "times are the median of the runs' medians with their range "
              + ("over the runs" if repeat > 1 else "over the repetitions") + "; ratios likewise. "
              "A case is called faster or slower only when every run agrees.", ""]
    if skipped:
        parts += ["Skipped:", ""] + [f"- {s['suite']} {s['case']}: {s['reason']}" for s in skipped] + [""]
    other_notes = [f"{suite}: {text}" for suite, text in (notes or {}).items() if suite not in SUITE_ORDER]
    parts += other_notes + ([""] if other_notes else [])
    with open(path, "w") as f:
        f.write("\n".join(parts))


def write_plots(out_dir: str, records: List[Dict]) -> List[str]:
    """speedup.png (fused_amp against torch's recipe and the best outside anchor of each case),
    ceiling_fraction.png and scaling.png; none where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    cases = [rows for suite in SUITE_ORDER if suite != "scaling" for rows in _cases(records, suite).values()]
    ours = [(next(r for r in rows if r["impl"] == "fused_amp"), reference(rows), best_anchor(rows))
            for rows in cases if any(r["impl"] == "fused_amp" for r in rows)]
    ours = [(r, ref, anchor) for r, ref, anchor in ours if ref or anchor]
    if ours:
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(ours)), 4.5))
        for i, label in enumerate(("torch's recipe", "best outside anchor")):
            xs = [j + i * 0.4 for j in range(len(ours))]
            ax.bar(xs, [r["speedup_vs"].get(pair[i], math.nan) if pair[i] else math.nan for r, *pair in ours],
                   0.4, label=f"vs {label}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + 0.2 for j in range(len(ours))])
        ax.set_xticklabels([f"{r['suite']}\n{r['case']}" for r, *_ in ours], rotation=60, ha="right", fontsize=7)
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
