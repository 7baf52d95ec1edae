"""One param's AdamW step as torchao's CPUOffloadOptimizer calls it, with the caches cold.

The offload suite's one-param case steps the same tensor again and again, so the Python objects
of the step and the tensor stay in cache. In the engine, each param's step follows the other
params' steps and grad copies, which stream megabytes through the caches. Here a 32 MB write
precedes each timed step (it is not timed). Prints, per size, the median time of one step
(fused_amp, torch's fused AdamW, and DeepSpeed's CPU AdamW where it is installed) over 5 rounds
in turns, with the rounds' range.

Usage: .venv/bin/python tools/one_param_cold.py [STEPS_PER_ROUND]
"""
import statistics
import sys
import time

import torch

from fused_amp.benchmark import recipes
from fused_amp.benchmark.suites.offload import ONE_PARAM, SIZES  # the suite's AdamWs and sizes

FLUSH_BYTES = 32 << 20  # past the L2 and the L3 share of these 2-core VMs


def main(steps: int) -> None:
    flush = torch.empty(FLUSH_BYTES // 4)
    for n in SIZES.values():
        optimizers = {}
        for name, (make, module) in ONE_PARAM.items():
            if module and not recipes.installed(module):
                continue
            param = torch.nn.Parameter(torch.randn(n))
            param.grad = torch.randn(n)
            # as the suite makes them: what an anchor sets that slows torch is undone (recipes.TORCH_ENV)
            with recipes.torch_env_kept():
                optimizers[name] = make([param], lr=1e-3, weight_decay=0.01)
                optimizers[name].step()  # (its state made, an anchor's op built)
        rounds = {name: [] for name in optimizers}
        for _ in range(5):
            for name, optimizer in optimizers.items():
                times = []
                for _ in range(steps):
                    flush.fill_(1.0)
                    start = time.perf_counter_ns()
                    optimizer.step()
                    times.append(time.perf_counter_ns() - start)
                rounds[name].append(statistics.median(times) / 1000)
        print(f"{n:>8} elements: " + "; ".join(
            f"{name} {statistics.median(r):.1f} us ({min(r):.1f}-{max(r):.1f})" for name, r in rounds.items()))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
