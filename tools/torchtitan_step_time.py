"""The step time of torchtitan's llama3 debug model on 4 gloo ranks (FSDP2 x TP2, its own trainer,
tests/torchtitan_cpu.py), torchtitan's stock AdamW against fused_amp's (clip in the step), in
turns: the median time from one logged step to the next over steps 3..N of each run, then the
median and spread of the runs (docs/torchtitan.md).

Usage: .venv/bin/python tools/torchtitan_step_time.py [--runs 3] [--steps 20] [--seq-len 64]
       [--batch 2] [--layout fsdp2xtp2]
"""
import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import torchtitan_cpu  # noqa: E402


def step_time(folder, assets, name, optimizer, options, layout):
    logged = torchtitan_cpu.launch(layout, [(Path(folder) / name, optimizer, options)], assets)[0][0]
    return statistics.median(b - a for a, b in zip(logged["logged_at"][2:], logged["logged_at"][3:]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--layout", default="fsdp2xtp2")
    args = parser.parse_args()
    options = {"steps": args.steps, "seq_len": args.seq_len, "batch": args.batch}
    with tempfile.TemporaryDirectory() as folder:
        assets = torchtitan_cpu.make_assets(os.path.join(folder, "assets"))
        times = {"torch": [], "fused_amp": []}
        for i in range(args.runs):
            for optimizer in times:
                times[optimizer].append(step_time(folder, assets, f"{optimizer}{i}", optimizer, options, args.layout))
    for optimizer, runs in times.items():
        ms = sorted(t * 1e3 for t in runs)
        print(f"{optimizer:>10}: median {statistics.median(ms):.1f} ms a step "
              f"(runs {', '.join(f'{t:.1f}' for t in ms)})")
    ratio = [t / f for t, f in zip(times["torch"], times["fused_amp"])]
    print(f"torch / fused_amp per turn: {', '.join(f'{r:.3f}' for r in ratio)}")


if __name__ == "__main__":
    main()
