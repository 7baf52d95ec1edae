"""Each optimizer of fused_amp.optim against torch's on the char LM of the memory suite
(fused_amp/benchmark/convergence.py): torch's on the fp32 model, ours on the bf16 model with fp32
masters, over the same seeds.

    python -m benchmarks.convergence [steps [name ...]]
"""
import os
import statistics
import sys
from typing import Dict, List

import torch

import fused_amp
from fused_amp.benchmark import convergence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))


# torch's own where it has one, else the tests' reference: (ours, theirs, lr, options of both)
def _optimizers():
    from reference_optim import ReferenceAdEMAMix, ReferenceLion
    o = fused_amp.optim
    return {
        "AdamW": (o.AdamW, torch.optim.AdamW, 2e-3, dict(weight_decay=0.0)),
        "SGD (momentum 0.9)": (o.SGD, torch.optim.SGD, 0.1, dict(momentum=0.9)),
        "Lion": (o.Lion, ReferenceLion, 2e-4, {}),
        "Adagrad": (o.Adagrad, torch.optim.Adagrad, 2e-2, {}),
        "RMSprop": (o.RMSprop, torch.optim.RMSprop, 1e-3, {}),
        "Adamax": (o.Adamax, torch.optim.Adamax, 4e-3, {}),
        "RAdam": (o.RAdam, torch.optim.RAdam, 2e-3, {}),
        "NAdam": (o.NAdam, torch.optim.NAdam, 2e-3, {}),
        "AdEMAMix": (o.AdEMAMix, ReferenceAdEMAMix, 2e-3, dict(weight_decay=0.0)),
        "Adadelta": (o.Adadelta, torch.optim.Adadelta, 1.0, {}),
        "Rprop": (o.Rprop, torch.optim.Rprop, 1e-4, dict(step_sizes=(1e-6, 1e-3))),
    }


def compare_optimizers(seeds: List[int], steps: int, names: List[str] = None) -> Dict[str, Dict]:
    """For each optimizer: the final losses of torch's on the fp32 model and of ours on the bf16
    model (fp32 masters), over the same seeds; their means and spreads."""
    data = convergence.corpus()
    out = {}
    for name, (ours, theirs, lr, kw) in _optimizers().items():
        if names and name not in names:
            continue
        row = {}
        for label, cls, dtype in (("torch fp32", theirs, torch.float32), ("fused_amp bf16 + masters", ours,
                                                                           torch.bfloat16)):
            runs = [convergence.train(name, seed, steps, lr=lr, data=data, dtype=dtype,
                                      make=lambda params, lr, c=cls: c(params, lr=lr, **kw)) for seed in seeds]
            losses = [r["loss"] for r in runs]
            row[label] = dict(losses=losses, mean=statistics.fmean(losses), spread=max(losses) - min(losses))
        out[name] = row
    return out


if __name__ == "__main__":  # the optimizers' rows, 3 seeds
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    print(f"char LM, {steps} steps, seeds 0-2: final held-out loss, mean (spread)")
    for name, row in compare_optimizers([0, 1, 2], steps, sys.argv[2:] or None).items():
        cells = [f"{label} {r['mean']:.4f} ({r['spread']:.4f})" for label, r in row.items()]
        diff = row["fused_amp bf16 + masters"]["mean"] - row["torch fp32"]["mean"]
        print(f"{name:20s} " + "   ".join(cells) + f"   difference {diff:+.4f}")
