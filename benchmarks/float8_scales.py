"""The fp8 weight scales of torchao's FSDP2 recipe, from the step or from a pass of their own, on
the CPU: 84M bf16 params with fp32 masters, fused_amp's AdamW.

- "step + torchao's precompute": the step, then what precompute_float8_dynamic_scale_for_fsdp
  computes on one rank: torch._foreach_norm(weights, inf) (a read of every weight), then the
  scales (clamp, float64 division, float32);
- "step writing the amax": the step with ops.step_'s weight_amax, then the same scales from it;
- "precompute alone": the extra pass by itself;
- "step alone": the step without the amax, what the amax costs the step.
The all-reduce, the same in both recipes, is left out. Timed in turns, 3 runs; the median and
the spread of each. Run: python -m benchmarks.float8_scales [params_in_millions]."""
import math
import sys

import torch

from fused_amp.benchmark.harness import Impl, time_alternating
from fused_amp.optim import AdamW

E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max


def scales_of(amax: torch.Tensor) -> torch.Tensor:
    """torchao's scales from the weights' amaxes (their dtype): as its precompute forms them."""
    return (E4M3_MAX / torch.clamp(amax, 1e-12).to(torch.float64)).to(torch.float32)


def make(n_params: int, tensors: int = 12, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    size = n_params // tensors
    params = [torch.nn.Parameter(torch.randn(size, generator=gen).to(torch.bfloat16)) for _ in range(tensors)]
    grads = [torch.randn(size, generator=gen).to(torch.bfloat16) * 1e-2 for _ in range(tensors)]
    opt = AdamW(params, lr=1e-4)
    for p, g in zip(params, grads):
        p.grad = g
    opt.step()  # the state, and the cached lists
    return params, grads, opt


def three(n_params: int):
    """Three like setups (make), for the recipes timed in turns; the seed set first."""
    torch.manual_seed(0)
    return [make(n_params) for _ in range(3)]


def grads_back(params, grads):
    """What runs before each timed step: the grads put back (the step may free them)."""
    def prepare():
        for p, g in zip(params, grads):
            p.grad = g
    return prepare


def main(n_params: int = 84_000_000, runs: int = 3):
    (a_params, a_grads, a_opt), (b_params, b_grads, b_opt), (c_params, c_grads, c_opt) = three(n_params)
    amax = torch.zeros(len(b_params))
    for lists, _ in b_opt._lists.groups[0].by_device.values():  # as fused_amp.optim._float8.plan sets it
        lists["weight_amax"] = amax
        lists.pop("op_parts", None)  # (formed from the lists at the first step: again at the next, with the amax)
    weights = [p.detach() for p in a_params]

    def step_then_precompute():
        a_opt.step()
        scales_of(torch.stack(torch._foreach_norm(weights, ord=math.inf)))

    def step_with_amax():
        b_opt.step()
        scales_of(amax.to(torch.bfloat16))

    def precompute_alone():
        scales_of(torch.stack(torch._foreach_norm(weights, ord=math.inf)))

    impls = [Impl("step + torchao's precompute", step_then_precompute, grads_back(a_params, a_grads)),
             Impl("step writing the amax", step_with_amax, grads_back(b_params, b_grads)),
             Impl("precompute alone", precompute_alone),
             Impl("step alone", c_opt.step, grads_back(c_params, c_grads))]
    times = time_alternating(impls, "cpu", reps=runs)
    # the same scales both ways
    theirs = scales_of(torch.stack(torch._foreach_norm([p.detach() for p in b_params], ord=math.inf)))
    assert torch.equal(scales_of(amax.to(torch.bfloat16)), theirs), "the amax the step wrote is not torch's"
    report(f"{n_params / 1e6:.0f}M bf16 params, fp32 masters, AdamW", runs, times, impls[0].name, impls[1].name)


def report(what: str, runs: int, times, separate: str, fused: str) -> None:
    """Each recipe's median and runs (ms), and the separate recipe's time over the fused one's
    per run."""
    print(f"{what}; {torch.get_num_threads()} threads; {runs} runs in turns")
    for name, ts in times.items():
        ms = sorted(t * 1e3 for t in ts)
        print(f"  {name:30s} median {ms[len(ms) // 2]:8.1f} ms   runs {', '.join(f'{m:.1f}' for m in ms)}")
    ratios = [x / y for x, y in zip(times[separate], times[fused])]
    print(f"  {separate} / {fused}, per run: {', '.join(f'{r:.3f}' for r in ratios)}"
          f" ({'faster in all runs' if min(ratios) > 1 else 'not faster in every run'})")

if __name__ == "__main__":
    main(int(float(sys.argv[1]) * 1e6) if len(sys.argv) > 1 else 84_000_000)
