"""fp8 weight copies with delayed scaling, written by the step or by a pass of their own, on the
CPU: 84M bf16 params with fp32 masters, fused_amp's AdamW.

- "step, then the cast": the step, then what a recipe that casts after the step runs: each
  weight's amax for its history (torch._foreach_norm(weights, inf)) and torchao's saturated cast
  with the scale the history gave, (w.float() * scale).clamp(-448, 448).to(float8_e4m3fn), into
  the copies; then the same delayed scaling update;
- "step writing the copies": fused_amp.float8.Float8Weights on the same weights: the step casts
  and records the amaxes, then the update;
- "step alone": the step without copies, what they cost the step.
The copies are checked bitwise equal after the runs. Timed in turns, 3 runs; the median and the
spread of each. Run: python -m benchmarks.float8_weights [params_in_millions]."""
import math
import sys

import torch

from benchmarks.float8_scales import grads_back, report, three
from fused_amp.benchmark.harness import Impl, time_alternating
from fused_amp.float8 import E4M3_MAX, Float8Weights


def main(n_params: int = 84_000_000, runs: int = 3):
    (a_params, a_grads, a_opt), (b_params, b_grads, b_opt), (c_params, c_grads, c_opt) = three(n_params)
    weights = [p.detach() for p in a_params]
    copies = Float8Weights(b_opt, b_params, amax_history_len=16)
    # the separate pass's own copies, history and scales, started as Float8Weights starts them
    a_copies = Float8Weights(a_opt, a_params, amax_history_len=16)
    a_opt._attached.float8_copies.clear()  # (kept for its tensors; the step does not write them)
    a_opt._lists.forget()

    def step_then_cast():
        a_opt.step()
        cast_scales = a_copies.scale.clone()
        for i, w in enumerate(weights):
            a_copies.data[i].copy_((w.float() * cast_scales[i]).clamp(-E4M3_MAX, E4M3_MAX))
        torch.reciprocal(cast_scales, out=a_copies.scale_inv)
        a_copies.amax_history[0] = torch.stack(torch._foreach_norm(weights, ord=math.inf)).float()
        a_copies.update()

    impls = [Impl("step, then the cast", step_then_cast, grads_back(a_params, a_grads)),
             Impl("step writing the copies", b_opt.step, grads_back(b_params, b_grads)),
             Impl("step alone", c_opt.step, grads_back(c_params, c_grads))]
    times = time_alternating(impls, "cpu", reps=runs)
    # the same copies, scales and histories both ways (both took the same steps)
    for mine, theirs in zip(copies.data, a_copies.data):
        assert torch.equal(mine.view(torch.uint8), theirs.view(torch.uint8)), "the copies differ"
    assert torch.equal(copies.amax_history, a_copies.amax_history) and torch.equal(copies.scale, a_copies.scale)
    report(f"{n_params / 1e6:.0f}M bf16 params, fp32 masters, AdamW, delayed scaling", runs, times, impls[0].name,
           impls[1].name)

if __name__ == "__main__":
    main(int(float(sys.argv[1]) * 1e6) if len(sys.argv) > 1 else 84_000_000)
