"""The fused_amp benchmark suite against stock PyTorch.

    python -m fused_amp.benchmark [--device cpu|cuda] [--quick] [--model MODULE:FACTORY]
                                  [--suite NAME ...] [--params N] [--repeat N] [--out DIR]
                                  [--time-budget SECONDS]

With --model, the optimizer step of your model's own parameter list in every recipe (torch's AMP
recipe, fused_amp in each memory mode, the outside anchors installed): step time, its ratio to
torch's, bytes held, and which mode to pick. Without it, the suites on this project's workloads:
unscale, optimizer, memory, muon, train, scaling, distributed, offload. The ceiling suite (the memory
bandwidth) always runs first. The whole plan runs --repeat times (3 in a full run, 1 in a quick
one), implementations timed in turns within each; a case is reported by the median of the
repeats' medians and their range, and fused_amp is called faster or slower only when every
repeat agrees. Writes DIR/results.json (everything), DIR/results.md (the summary, one table per
suite) and PNG plots, and prints the summary.
"""
import argparse
import json
import os
import sys
import time

import torch

from fused_amp.benchmark import harness, impls, native, report, user_model
from fused_amp.benchmark.suites import DEFAULT, SUITES


class Context:
    def __init__(self, device, quick, scale, model=None):
        self.device, self.quick, self.scale = device, quick, scale
        self.model = model  # user_model.ModelParams of --model, or None
        self.reps = 5 if quick else 9  # per repeat
        self.ceiling_gbps = None
        self.ceiling = {}
        self.native = native.probe(device)  # dtype -> (matmul slowdown vs fp32, native?)
        self.skipped = []  # cases not run, with why
        self.notes = {}  # suite -> a line for the summary (as the latest run wrote it)
        self.per_run = {}  # a suite's key -> what each run measured, for a note over every run

    def add_ceiling(self, measured):
        """Keep the best of every kernel over the repeats; the ceiling is the best of all."""
        for key, value in measured.items():
            self.ceiling[key] = max(value, self.ceiling.get(key, 0.0))
        self.ceiling_gbps = self.ceiling["ceiling_gbps"]

    def note(self, suite, text):
        self.notes[suite] = text

    def skip(self, suite, case, reason):
        if dict(suite=suite, case=case, reason=reason) not in self.skipped:  # (once over the repeats)
            self.skipped.append(dict(suite=suite, case=case, reason=reason))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fused_amp.benchmark", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="smaller cases and fewer repetitions")
    parser.add_argument("--model", default=None, metavar="MODULE:FACTORY",
                        help="your model: FACTORY() from MODULE returns an nn.Module (or hf:NAME, a "
                             "Hugging Face config found locally); runs the model suite on its params")
    parser.add_argument("--repeat", type=int, default=None,
                        help="runs of the whole plan (default: 3, or 1 with --quick)")
    parser.add_argument("--params", type=float, default=None,
                        help="your model's parameter count: the summary predicts its step time and "
                             "memory from the scaling fit (e.g. 1.3e9)")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="fail (exit 3) when the run takes longer than this many seconds")
    parser.add_argument("--out", default="bench-results", help="output folder (default: bench-results)")
    parser.add_argument("--suite", nargs="+", choices=[s for s in SUITES if s != "ceiling"],
                        help="suites to run (default: model with --model, else all the others)")
    parser.add_argument("--case", nargs="+", default=None,
                        help="run only the cases whose name starts with one of these (e.g. adagrad/ nadam/)")
    parser.add_argument("--size-scale", type=float, default=1.0,
                        help="shrink every case by this factor (for testing the suite itself)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: CUDA is not available")
    if args.suite and "model" in args.suite and not args.model:
        sys.exit("--suite model needs --model MODULE:FACTORY")
    started = time.monotonic()
    model = user_model.load(args.model) if args.model else None
    ctx = Context(args.device, args.quick, args.size_scale, model)
    repeat = args.repeat or (1 if args.quick else 3)
    names = ["ceiling"] + (args.suite or (["model"] if model else DEFAULT))
    plan = [(name, case, fn) for name in names for case, fn in SUITES[name].cases(ctx)
            if name == "ceiling" or not args.case or case.startswith(tuple(args.case))]
    runs = []  # one record per (repeat, case, impl)
    progress = _progress(repeat * len(plan))
    for r in range(repeat):
        for name, case, fn in plan:
            progress.set_description(f"run {r + 1}/{repeat} {name}: {case}")
            for rec in fn(ctx):
                rec["repeat"] = r
                runs.append(rec)
            progress.update(1)
    progress.close()
    records = report.aggregate(runs, ctx.ceiling_gbps)
    for rec in records:
        harness.validate_record(rec)
    os.makedirs(args.out, exist_ok=True)
    machine = dict(harness.machine_info(args.device), native_half={
        k: {"matmul_slowdown_vs_fp32": v[0], "native": v[1]} for k, v in ctx.native.items()})
    over_ceiling = report.over_ceiling(records)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"machine": machine, "ceiling": ctx.ceiling, "repeat": repeat,
                   "fused_amp_settings": impls.FUSED_AMP_SETTINGS, "skipped": ctx.skipped,
                   "notes": ctx.notes,
                   "ceiling_exceeded_by": over_ceiling, "records": records, "runs": runs}, f, indent=1)
    model_params = int(args.params) if args.params else None
    plots = report.write_plots(args.out, records)
    report.write_markdown(os.path.join(args.out, "results.md"), machine, ctx.ceiling, records,
                          repeat, ctx.skipped, model_params, ctx.notes, plots)
    print()
    print("\n".join(report.summary(records, machine, repeat, model_params)))
    if over_ceiling:
        print("the ceiling is wrong: " + ", ".join(over_ceiling) + " moved more than it")
    verdicts = report.verdict_lines(records)
    if verdicts:
        print(f"\nfused_amp per case, against torch's recipe and the best outside anchor (ceiling "
              f"{ctx.ceiling_gbps:.1f} GB/s):")
        print("\n".join(verdicts))
    for s in ctx.skipped:
        print(f"  skipped {s['suite']} {s['case']}: {s['reason']}")
    for suite, text in ctx.notes.items():
        print(f"  {suite}: {text}")
    elapsed = time.monotonic() - started
    print(f"\nwrote {args.out}/results.json, {args.out}/results.md" + "".join(f", {p}" for p in plots)
          + f" ({elapsed:.0f} s)")
    if args.time_budget is not None and elapsed > args.time_budget:
        print(f"over the time budget: {elapsed:.0f} s > {args.time_budget:.0f} s", file=sys.stderr)
        return 3
    return 0


def _progress(total):
    try:
        from tqdm import tqdm
        return tqdm(total=total, file=sys.stderr, dynamic_ncols=True)
    except ImportError:  # a plain counter when tqdm is missing
        class Plain:
            def __init__(self):
                self.done = 0

            def set_description(self, text):
                print(f"[{self.done + 1}/{total}] {text}", file=sys.stderr, flush=True)

            def update(self, n):
                self.done += n

            def close(self):
                pass
        return Plain()


if __name__ == "__main__":
    sys.exit(main())
