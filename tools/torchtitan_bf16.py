"""bf16 training in torchtitan's own trainer (llama3 debug model, tests/torchtitan_cpu.py):
fused_amp with bf16 params and masters in each memory mode against torchtitan's
``training.dtype="bfloat16"`` (bf16 params, torch's AdamW, no masters) and its stock run (fp32
params, bf16 mixed precision), over several seeds: the loss curve of each (mean over seeds),
the final loss's mean and spread, and the bytes per param of params + optimizer state.

Usage: .venv/bin/python tools/torchtitan_bf16.py [--seeds 3] [--steps 100] [--ranks 1] [--only TEXT]
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

VARIANTS = {
    "stock (fp32 params, bf16 compute)": ("torch", {}),
    "torchtitan bf16 (no masters)": ("torch", {"dtype": "bfloat16"}),
    "fused_amp bf16 + fp32 masters": ("fused_amp", {"dtype": "bfloat16", "master_weights": "fp32"}),
    "fused_amp bf16 + remainder": ("fused_amp", {"dtype": "bfloat16", "master_weights": "remainder"}),
    "fused_amp bf16 + 24-bit": ("fused_amp", {"dtype": "bfloat16", "master_weights": "remainder8"}),
    "fused_amp bf16 + remainder, 8-bit state": ("fused_amp", {"dtype": "bfloat16", "master_weights": "remainder",
                                                              "state_dtype": "uint8"}),
}


def run(folder, assets, name, optimizer, options, ranks):
    layout = "1" if ranks == 1 else "fsdp2xtp2"
    return torchtitan_cpu.launch(layout, [(Path(folder) / name, optimizer, options)], assets, ranks)[0][0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--only", help="the runs whose label holds this text")
    args = parser.parse_args()
    marks = sorted({1, args.steps // 10, args.steps // 4, args.steps // 2, args.steps} - {0})
    print(f"| run ({args.seeds} seeds, {args.ranks} rank(s)) | bytes/param | "
          + " | ".join(f"loss @{m}" for m in marks) + " | final: mean (spread) |")
    print("|---|---|" + "---|" * len(marks) + "---|")
    with tempfile.TemporaryDirectory() as folder:
        assets = torchtitan_cpu.make_assets(os.path.join(folder, "assets"))
        for label, (optimizer, options) in VARIANTS.items():
            if args.only and args.only not in label:
                continue
            results = [run(folder, assets, f"v{seed}", optimizer,
                           dict(options, seed=seed, steps=args.steps, max_norm=1.0), args.ranks)
                       for seed in range(args.seeds)]
            curves = [r["records"]["loss"] for r in results]
            mean = [statistics.mean(c[m - 1] for c in curves) for m in marks]
            final = [c[-1] for c in curves]
            print(f"| {label} | {results[0]['bytes_per_param']:.2f} | "
                  + " | ".join(f"{v:.4f}" for v in mean)
                  + f" | {statistics.mean(final):.4f} ({min(final):.4f}-{max(final):.4f}) |", flush=True)


if __name__ == "__main__":
    main()
