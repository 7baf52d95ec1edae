"""4-bit optimizer state (state_dtype=torch.uint4) on the char LM of the memory suite
(fused_amp/benchmark/convergence.py), side by side with fp32 state and with torchao's
AdamW4bit, whose scheme it follows, in one run over the same seeds: the final held-out loss,
mean and spread (max - min) over the seeds, and the optimizer's bytes per param.

    python -m benchmarks.state4 [steps]
"""
import statistics
import sys

import torch

from fused_amp.benchmark import convergence

MODES = ["fp32 masters", "8-bit state", "4-bit state", "remainder + 4-bit state", "24-bit masters + 4-bit state",
         "torchao AdamW4bit (bf16 weights)"]


def state_bytes_per_param(mode: str) -> float:
    """What the optimizer holds per param of the char LM after one step (masters and state)."""
    torch.manual_seed(0)
    model = convergence.CharMLP().to(torch.bfloat16)
    opt = convergence.MODES[mode](model.parameters(), 1e-3)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()

    def held(t):
        inner = [getattr(t, name) for name in ("codes", "scale") if isinstance(getattr(t, name, None), torch.Tensor)]
        return sum(x.numel() * x.element_size() for x in inner) if inner else t.numel() * t.element_size()
    n = sum(p.numel() for p in model.parameters())
    return sum(held(t) for s in opt.state.values() for k, t in s.items()
               if isinstance(t, torch.Tensor) and k != "step") / n


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    seeds = [0, 1, 2]
    print(f"char LM, bf16 weights, AdamW lr 2e-3, {steps} steps, seeds {seeds}: final held-out loss")
    print(f"{'mode':36s} {'mean':>8s} {'spread':>8s}  {'losses':28s} {'B/param':>8s}")
    data = convergence.corpus()
    for mode in MODES:
        if not convergence.available(mode):
            print(f"{mode:36s} skipped: not installed")
            continue
        losses = [convergence.train(mode, seed, steps, data=data)["loss"] for seed in seeds]
        cells = " ".join(f"{x:.4f}" for x in losses)
        print(f"{mode:36s} {statistics.fmean(losses):8.4f} {max(losses) - min(losses):8.4f}  {cells:28s} "
              f"{state_bytes_per_param(mode):8.2f}", flush=True)
