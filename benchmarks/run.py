"""The fused_amp benchmark suite against stock PyTorch.

    python benchmarks/run.py [--device cpu|cuda] [--quick] [--out DIR] [--suite NAME ...]

Suites: ceiling (always first: every ceiling_frac refers to it), unscale, optimizer, train,
scaling. Writes DIR/results.json, DIR/results.md and PNG plots, and ends with a summary.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness, impls, report  # noqa: E402
from benchmarks.suites import SUITES  # noqa: E402


class Context:
    def __init__(self, device, quick, scale):
        self.device, self.quick, self.scale = device, quick, scale
        self.reps = 5 if quick else 20
        self.ceiling_gbps = None
        self.ceiling = {}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="smaller cases and fewer repetitions")
    parser.add_argument("--out", default="bench-results", help="output folder (default: bench-results)")
    parser.add_argument("--suite", nargs="+", choices=[s for s in SUITES if s != "ceiling"],
                        help="suites to run (default: all)")
    parser.add_argument("--size-scale", type=float, default=1.0,
                        help="shrink every case by this factor (for testing the suite itself)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: CUDA is not available")
    ctx = Context(args.device, args.quick, args.size_scale)
    names = ["ceiling"] + (args.suite or [s for s in SUITES if s != "ceiling"])
    plan = [(name, case, fn) for name in names for case, fn in SUITES[name].cases(ctx)]
    records = []
    progress = _progress(len(plan))
    for name, case, fn in plan:
        progress.set_description(f"{name}: {case}")
        records += fn(ctx)
        progress.update(1)
    progress.close()
    for rec in records:
        harness.validate_record(rec)
    os.makedirs(args.out, exist_ok=True)
    machine = harness.machine_info(args.device)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"machine": machine, "ceiling": ctx.ceiling,
                   "fused_amp_settings": impls.FUSED_AMP_SETTINGS, "records": records}, f, indent=1)
    report.write_markdown(os.path.join(args.out, "results.md"), machine, ctx.ceiling, records)
    plots = report.write_plots(args.out, records)
    print(f"\nceiling: {', '.join(f'{k} {v:.1f}' for k, v in ctx.ceiling.items())} GB/s")
    print("fused_amp (optimizer settings: " + ", ".join(f"{k}={v}" for k, v in impls.FUSED_AMP_SETTINGS.items())
          + ") against stock PyTorch (median step time, speedups, fraction of the ceiling):")
    print("\n".join(report.summary_lines(records)))
    print(f"\nwrote {args.out}/results.json, {args.out}/results.md" + "".join(f", {p}" for p in plots))
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
