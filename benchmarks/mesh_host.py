"""Host time per param of a scaler step + update on a 2-D mesh (TP + FSDP2, 2x2) beside 1-D
FSDP2, on 4 gloo ranks, with the FSDP2 host benchmark's method (fused_amp.benchmark.suites.
distributed: the stepping thread's CPU time, median of 20 steps per turn, the layouts in turns,
grads restored before each step).

The model: 200 blocks of Linear(64, 64) + LayerNorm(64), bf16, fp32 masters. Under TP + FSDP2
each Linear is column-parallel on tp and sharded by FSDP2 over dp (its weight and bias
_StridedShard(0) on dp, Shard(0) on tp), and each LayerNorm, which TP leaves alone, is sharded
over dp only, on the dp submesh: two meshes and three placements, as in torchtitan's models.
The grads are set directly (random, placed as the params): a step's host work does not depend on
how they were made.

    python benchmarks/mesh_host.py [runs]   # default 3
"""
import statistics
import sys
import time

import torch

from fused_amp.benchmark import harness

BLOCKS, STEPS_PER_TURN, WARMUP = 200, 20, 2
RECIPES = {"fp32 masters": {}, "clipping every step": dict(max_grad_norm=1.0)}


def _model(layout):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
                                  for _ in range(BLOCKS)]).bfloat16()
    if layout == "1-D FSDP2":
        mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("dp",))
    else:
        mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        for block in model:
            parallelize_module(block, mesh2["tp"], {"0": ColwiseParallel()})
        mesh = mesh2["dp"]
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    params = list(model.parameters())
    grads = [torch.randn_like(p) * 256.0 for p in params]  # DTensors placed as the params
    return params, grads


def _worker(rank, world, reps):
    import fused_amp

    steps = {}
    for layout in ("1-D FSDP2", "TP + FSDP2 2x2"):
        for recipe, kw in RECIPES.items():
            params, grads = _model(layout)
            opt = fused_amp.optim.AdamW(params, lr=1e-4, **kw)
            scaler = fused_amp.GradScaler("cpu", init_scale=256.0)
            scaler.scale(torch.ones(()))

            def step(opt=opt, scaler=scaler, params=params, grads=grads):
                for p, g in zip(params, grads):
                    p.grad = g.clone()  # (outside the timed part below)
                return lambda: (scaler.step(opt), scaler.update())
            steps[(layout, recipe)] = step
    cpu = {k: [] for k in steps}
    for rep in range(WARMUP + reps):  # in turns
        for key, prepare in steps.items():
            torch.distributed.barrier()
            ts = []
            for _ in range(STEPS_PER_TURN):
                run = prepare()
                start = time.thread_time()
                run()
                ts.append(time.thread_time() - start)
            if rep >= WARMUP:
                cpu[key].append(statistics.median(ts) * 1e6 / (BLOCKS * 4))
    return cpu


def main(runs=3):
    per_run = [harness.run_ranks(_worker, 4, 1, deadline_s=600)[0] for _ in range(runs)]
    print(f"CPU time of the stepping thread per param per rank (us), rank 0, {runs} runs (median, range):")
    for recipe in RECIPES:
        one = [r[("1-D FSDP2", recipe)][0] for r in per_run]
        two = [r[("TP + FSDP2 2x2", recipe)][0] for r in per_run]
        ratios = [b / a for a, b in zip(one, two)]
        print(f"  {recipe}: 1-D {statistics.median(one):.2f} ({min(one):.2f}-{max(one):.2f}), "
              f"2-D {statistics.median(two):.2f} ({min(two):.2f}-{max(two):.2f}), "
              f"2-D / 1-D {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
