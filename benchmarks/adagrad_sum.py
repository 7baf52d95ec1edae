"""What each state dtype does to Adagrad's sum of squared grads, which only grows: fused_amp's
Adagrad over 10,000 steps of N(0, 1) grads on 4,096 elements, its sqrt(sum) (what the update
divides by) against the exact sum, for fp32, bf16 and 8-bit state, rounded to nearest and
stochastically. Run: python -m benchmarks.adagrad_sum [steps]."""
import sys

import torch

from fused_amp.optim import Adagrad


def sum_errors(steps: int = 10_000, n: int = 4096, seed: int = 0):
    settings = {"fp32": dict(state_dtype=torch.float32),
                "bf16, to nearest": dict(state_dtype=torch.bfloat16, stochastic_rounding=False),
                "bf16, stochastic (the default)": dict(state_dtype=torch.bfloat16),
                "8-bit, to nearest": dict(state_dtype=torch.uint8, stochastic_rounding=False),
                "8-bit, stochastic (the default)": dict(state_dtype=torch.uint8)}
    params = {name: torch.nn.Parameter(torch.zeros(n)) for name in settings}
    opts = {name: Adagrad([params[name]], lr=0.0, min_8bit_size=0, rounding_seed=seed, **kw)
            for name, kw in settings.items()}
    exact = torch.zeros(n, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        g = torch.randn(n, generator=gen)
        exact += g.double().square()
        for name, opt in opts.items():
            params[name].grad = g.clone()
            opt.step()
    out = {}
    for name, opt in opts.items():
        values = opt.state_dict()["state"][0]["sum"].double()  # fp32 values, 8-bit codes decoded
        rel = (values.sqrt() / exact.sqrt() - 1).abs()
        out[name] = (rel.median().item(), rel.max().item())
    return out


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    print(f"Adagrad's sqrt(sum) after {steps} steps of N(0, 1) grads, 4,096 elements: relative error")
    for name, (median, worst) in sum_errors(steps).items():
        print(f"{name:34s} median {median:8.2%}   max {worst:8.2%}")
