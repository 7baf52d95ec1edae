"""Where the FSDP2 step's host time goes: the distributed benchmark's fsdp2-host case (2 gloo
ranks), with the CPU time of the stepping thread split over the parts of a scaler step, per
param, for each AdamW recipe on FSDP2 shards and on its plain-tensor twin.

    .venv/bin/python tools/fsdp_host_breakdown.py [REPS]

Parts: the scaler's gathering of the grads (and, for DTensors, their local shards and specs),
its overflow check (with clipping, the norm's pass, which is the check too), the flag's
all-reduce, the optimizer's cached lists (their check and the grads), and the fused op. CPU
time, not wall: gloo's all-reduce blocks the host while it waits for the other rank, which
NCCL's does not. Rank 0's figures; the rest of a step is what the parts leave out (the update
of the scale, Python between them)."""
import collections
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fused_amp.benchmark import harness  # noqa: E402

PARTS = ("gather", "check", "all_reduce", "device_lists", "op")


def _worker(rank, world, reps):
    import torch.distributed as dist

    from fused_amp.benchmark.suites import distributed
    from fused_amp import ops
    from fused_amp.grad_scaler import GradScaler
    from fused_amp.optim._group_lists import ListCache

    rows = list(distributed.host_rows())
    spent = collections.defaultdict(float)  # (row, part) -> CPU seconds
    row = [None]

    def timed(part, fn):
        def call(*args, **kwargs):
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[row[0], part] += time.thread_time() - start
        return call

    dist.all_reduce = timed("all_reduce", dist.all_reduce)
    ops.call_step = timed("op", ops.call_step)  # (the optimizers call the step op through it)
    ops.non_finite_check_ = timed("check", ops.non_finite_check_)
    ops.grad_norm_ = timed("check", ops.grad_norm_)  # with clipping, the check and the norm
    GradScaler._gather = timed("gather", GradScaler._gather)
    ListCache.lists = timed("device_lists", ListCache.lists)
    calls = [0]
    timed_step = distributed._timed

    def step(fn):  # the worker times each row's 20 steps in a row, the rows in turns
        row[0] = rows[calls[0] // distributed.STEPS_PER_TURN % len(rows)]
        calls[0] += 1
        wall, cpu = timed_step(fn)
        spent[row[0], "step"] += cpu
        return wall, cpu

    distributed._timed = step
    result = distributed._host_worker(rank, world, reps)
    steps = calls[0] // len(rows)
    return {key: seconds / steps * 1e6 / result["n_tensors"][key[0]] for key, seconds in spent.items()}


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    from fused_amp.benchmark.suites import distributed
    us = harness.run_ranks(_worker, distributed.WORLD, reps)[0]
    print(f"{distributed.HOST_CASE}, rank 0, CPU time per param (us), {reps} reps x "
          f"{distributed.STEPS_PER_TURN} steps:")
    print(f"{'row':52s}" + "".join(f"{p:>17s}" for p in PARTS + ("step",)))
    for recipe, (cls_name, _) in distributed.RECIPES.items():
        if cls_name != "AdamW":
            continue
        for name in distributed.row_names(recipe):
            print(f"{name:52s}" + "".join(f"{us.get((name, p), 0.0):17.2f}" for p in PARTS + ("step",)))


if __name__ == "__main__":
    main()
