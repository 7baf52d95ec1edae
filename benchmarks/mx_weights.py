"""MXFP8 weight copies (e4m3 blocks of 32, each with its e8m0 scale), written by the step or by
torchao's cast as a pass of its own, on the CPU: 84M bf16 params with fp32 masters, fused_amp's
AdamW.

- "step, then to_mx": the step, then torchao's to_mx(w, float8_e4m3fn, 32) of every weight (its
  default FLOOR scaling), into the copies;
- "step writing the copies": fused_amp.float8.MXWeights on the same weights: the step forms each
  block's scale and casts the block in the pass that writes it;
- "step alone": the step without copies, what they cost the step.
The copies and scales are checked bitwise equal after the runs. Timed in turns, 3 runs; the
median and the spread of each. Needs torchao. Run: python -m benchmarks.mx_weights
[params_in_millions]."""
import sys

import torch
from torchao.prototype.mx_formats.mx_tensor import to_mx

from benchmarks.float8_scales import grads_back, report, three
from fused_amp.benchmark.harness import Impl, time_alternating
from fused_amp.float8 import MXWeights


def main(n_params: int = 84_000_000, runs: int = 3):
    (a_params, a_grads, a_opt), (b_params, b_grads, b_opt), (c_params, c_grads, c_opt) = three(n_params)
    weights = [p.detach() for p in a_params]
    copies = MXWeights(b_opt, b_params)
    a_data = [torch.empty_like(w, dtype=torch.float8_e4m3fn) for w in weights]
    a_scales = [torch.empty(w.shape[:-1] + (w.shape[-1] // 32,), dtype=torch.float8_e8m0fnu) for w in weights]

    def step_then_cast():
        a_opt.step()
        for w, data, scales in zip(weights, a_data, a_scales):
            s, d = to_mx(w, torch.float8_e4m3fn, 32)
            data.copy_(d)
            scales.copy_(s)

    impls = [Impl("step, then to_mx", step_then_cast, grads_back(a_params, a_grads)),
             Impl("step writing the copies", b_opt.step, grads_back(b_params, b_grads)),
             Impl("step alone", c_opt.step, grads_back(c_params, c_grads))]
    times = time_alternating(impls, "cpu", reps=runs)
    # the same copies and scales both ways (both took the same steps)
    for mine, theirs in zip(copies.data + copies.scales, a_data + a_scales):
        assert torch.equal(mine.view(torch.uint8), theirs.view(torch.uint8)), "the copies differ"
    report(f"{n_params / 1e6:.0f}M bf16 params, fp32 masters, AdamW, MXFP8 copies", runs, times, impls[0].name,
           impls[1].name)


if __name__ == "__main__":
    main(int(float(sys.argv[1]) * 1e6) if len(sys.argv) > 1 else 84_000_000)
