"""Fine-tuning at a small learning rate on O(1) weights: where the precision of the masters
decides whether updates happen at all.

A bf16 linear layer with O(1) weights (W0 ~ N(0, 1), as muP-style models and norm gains hold
theirs) is fine-tuned towards a teacher W0 + 0.001 N(0, 1) with AdamW at lr 1e-5, full batch on
orthonormal inputs (the basis vectors), so that the gradient is exact and each Adam update is
lr in size: below half a bf16 ulp for every |w| above 2^-9 (plain bf16 drops all of them), and
below half a 24-bit ulp (2^-16) for |w| in [1, 2) (24-bit masters rounded to nearest drop those:
about a third of N(0, 1) weights). Exact masters keep every update; 24-bit masters rounded
stochastically keep them in expectation. Reported: the loss (squared distance to the teacher)
after the steps over the loss at the start; 1.0 means nothing was learned. 500 steps are enough
for exact masters to cover the offsets (3 sigma = 300 updates of lr).

    python benchmarks/finetune.py [--steps 500] [--seeds 0 1 2]
"""
import argparse
import statistics
from typing import Callable, Dict, List

import torch

from fused_amp.benchmark.convergence import _fused, _torchao_sr, available

WIDTH = 128
TEACHER_OFFSET = 0.01


MODES: Dict[str, Callable] = {
    "fp32 masters": _fused(),
    "remainder (exact, 16-bit)": _fused(master_weights="remainder"),
    "24-bit masters, stochastic": _fused(master_weights="remainder8"),
    "24-bit masters, nearest": _fused(master_weights="remainder8", stochastic_rounding=False),
    "24-bit masters + 8-bit state": _fused(master_weights="remainder8", state_dtype=torch.uint8),
    "plain bf16 (no masters)": _fused(master_weights=False),
    "torchao bf16 SR AdamW": _torchao_sr,
}
OPTIONAL = {"torchao bf16 SR AdamW": "torchao"}


def train(mode: str, seed: int, steps: int, lr: float = 1e-5) -> float:
    """The final loss over the initial one of a fine-tune from seed ``seed`` (weights, teacher)."""
    gen = torch.Generator().manual_seed(seed)
    w0 = torch.randn(WIDTH, WIDTH, generator=gen).bfloat16()
    teacher = w0.float() + TEACHER_OFFSET * torch.randn(WIDTH, WIDTH, generator=gen)
    layer = torch.nn.Linear(WIDTH, WIDTH, bias=False).bfloat16()
    with torch.no_grad():
        layer.weight.copy_(w0)
    opt = MODES[mode](layer.parameters(), lr)
    x = torch.eye(WIDTH)  # orthonormal inputs, all of them: the exact gradient

    def loss():  # the forward computes in fp32 from the bf16 weight
        return ((x @ layer.weight.float().T - x @ teacher.T) ** 2).sum()

    with torch.no_grad():
        start = loss().item()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()
    with torch.no_grad():
        return loss().item() / start


def compare(modes: List[str], seeds: List[int], steps: int) -> Dict[str, Dict]:
    out = {}
    for mode in modes:
        losses = [train(mode, seed, steps) for seed in seeds]
        out[mode] = dict(losses=losses, mean=statistics.fmean(losses), spread=max(losses) - min(losses))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    modes = [m for m in MODES if available(m, OPTIONAL)]
    results = compare(modes, args.seeds, args.steps)
    print(f"fine-tune of a {WIDTH}x{WIDTH} bf16 layer with N(0, 1) weights towards a teacher "
          f"{TEACHER_OFFSET} N(0, 1) away, AdamW lr 1e-5, {args.steps} steps, seeds {args.seeds}: "
          "final loss / initial loss")
    print("| mode | mean | spread | per seed |\n|---|---|---|---|")
    for mode, r in results.items():
        print(f"| {mode} | {r['mean']:.4f} | {r['spread']:.4f} | {', '.join(f'{x:.4f}' for x in r['losses'])} |")


if __name__ == "__main__":
    main()
