"""Nearest vs stochastic rounding of the 8-bit codes (state_dtype=torch.uint8): how far Adam's
moments drift from fp32 state's over many steps (issue 22).

An 8-bit moment is requantized every step. With beta2 = 0.999, v moves by 0.1% of (g^2 - v) per
step, far less than the gap between neighbouring codes (about 2/c of the value at code c), so
to nearest most of those small moves round away; stochastic rounding keeps them in expectation.
This runs fused_amp's Adam (the real kernels) with lr = 0, so that the params stay put and only
the state is compared: the same stationary grads (each element's scale drawn log-uniformly over
three decades, so that a block holds large and small elements, as a layer does) go to fp32
state, 8-bit codes to nearest and 8-bit codes stochastically. After each checkpoint step it
reports, against fp32 state: the median ratio of v (the bias), the mean |log ratio| of v, and
the relative RMS error of the update m / (sqrt(v) + eps); over 3 seeds (median, and range).

    python benchmarks/code_rounding.py [--steps 100 1000 3000] [--seeds 3] [--n 65536]
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fused_amp.optim import Adam  # noqa: E402
from fused_amp.optim._quantize import ABSMAX, dequantize  # noqa: E402

ROUNDINGS = {"fp32 state": dict(state_dtype=torch.float32),
             "8-bit, nearest": dict(state_dtype=torch.uint8, stochastic_rounding=False),
             "8-bit, stochastic": dict(state_dtype=torch.uint8, stochastic_rounding=True)}


def moments(opt, p):
    s = opt.state[p]
    if s["exp_avg"].dtype == torch.float32:
        return s["exp_avg"].double(), s["exp_avg_sq"].double()
    return (dequantize(s["exp_avg"], s[ABSMAX][0], True).double(),
            dequantize(s["exp_avg_sq"], s[ABSMAX][1], False).double())


def drift(seed: int, checkpoints, n: int, decades: float, eps: float = 1e-8):
    """{checkpoint: {rounding: (median v ratio, mean |log v ratio|, update rms error)}}."""
    gen = torch.Generator().manual_seed(seed)
    scale = 10.0 ** (-decades * torch.rand(n, generator=gen))
    params = {name: torch.nn.Parameter(torch.zeros(n)) for name in ROUNDINGS}
    opts = {name: Adam([params[name]], lr=0.0, min_8bit_size=0, rounding_seed=seed, **kw)
            for name, kw in ROUNDINGS.items()}
    out = {}
    for step in range(1, max(checkpoints) + 1):
        g = torch.randn(n, generator=gen) * scale
        for name, opt in opts.items():
            params[name].grad = g.clone()
            opt.step()
        if step in checkpoints:
            m32, v32 = moments(opts["fp32 state"], params["fp32 state"])
            u32 = m32 / (v32.sqrt() + eps)
            row = {}
            for name in list(ROUNDINGS)[1:]:
                m, v = moments(opts[name], params[name])
                ratio = v / v32
                u = m / (v.sqrt() + eps)
                row[name] = (ratio.median().item(), ratio.log().abs().mean().item(),
                             ((u - u32).norm() / u32.norm()).item())
            out[step] = row
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, nargs="+", default=[100, 1000, 3000])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--decades", type=float, default=3.0)
    args = ap.parse_args()
    runs = [drift(seed, set(args.steps), args.n, args.decades) for seed in range(args.seeds)]
    print(f"Adam (beta2 0.999) with lr 0 on {args.n} elements of stationary grads, against fp32 state; "
          f"median over seeds 0..{args.seeds - 1} (range)")
    print("| steps | codes | median v / fp32 v | mean abs log(v / fp32 v) | update error (relative RMS) |")
    print("|---|---|---|---|---|")
    for step in args.steps:
        for name in list(ROUNDINGS)[1:]:
            cols = list(zip(*[r[step][name] for r in runs]))
            cells = [f"{statistics.median(c):.4f} ({min(c):.4f}-{max(c):.4f})" for c in cols]
            print(f"| {step} | {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
