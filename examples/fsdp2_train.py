"""FSDP2 with fused_amp: bf16 shards, fp32 masters in the optimizer, our GradScaler.

    python examples/fsdp2_train.py            # 2 CPU ranks over gloo, spawned here
    torchrun --nproc-per-node 2 examples/fsdp2_train.py   # under torchrun: NCCL where GPUs are

Each rank trains a small MLP on its own batches; the loss printed by rank 0 falls, and every
rank ends with the same full params.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import fused_amp


def train(steps=30):
    rank = dist.get_rank()
    device = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    torch.manual_seed(0)  # the same initial model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    model = model.to(device, torch.bfloat16)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)  # params are now bf16 DTensor shards
    optimizer = fused_amp.optim.AdamW(model.parameters(), lr=1e-2)  # fp32 masters, sharded alike
    scaler = fused_amp.GradScaler(device)
    gen = torch.Generator().manual_seed(rank)
    target = torch.nn.Linear(32, 1).to(device)
    for step in range(steps):
        x = torch.randn(64, 32, generator=gen).to(device)
        with torch.no_grad():
            y = target(x)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.bfloat16()).float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)  # every rank skips together on an overflow anywhere
        scaler.update()
        if rank == 0 and step % 10 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)
    full = [p.full_tensor() for p in model.parameters()]
    if rank == 0:
        print(f"final loss {loss.item():.4f}", flush=True)
    return full


def _spawned(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    main("gloo")
    # The rank is done and its process group destroyed: leave without the interpreter's teardown,
    # in which torch's C++ threads are destroyed in no set order and, rarely, a gloo rank dies of
    # "terminate called without an active exception" (pytorch/pytorch#90549; benchmarks/harness.py
    # leaves its ranks the same way). torchrun's ranks (main() below) are left as they are.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(backend=None):
    dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))
    try:
        train()
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:  # under torchrun
        main()
    else:
        import socket

        import torch.multiprocessing as mp
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free_port = s.getsockname()[1]
        mp.spawn(_spawned, args=(2, free_port), nprocs=2)
