"""Under torch.distributed (CPU, gloo, 2 ranks): the optimizer step per rank on FSDP2 shards,
fused_amp against torch's fused Adam on the same DTensors, and the bytes per param each rank
holds for params, grads and optimizer state under FSDP2, ZeRO-1 and DDP; and the host time per
param of the step where kernels are short (many small params, each block fully_shard'ed), which
decides a sharded model's step on a GPU (pytorch/pytorch#134191)."""
import contextlib
import statistics
import time

import torch

from fused_amp.benchmark import harness, workloads

WORLD = 2
INIT_SCALE = 1024.0


def cases(ctx):
    n = 16_000_000
    case = f"fsdp2-adam/{n // 1_000_000}M"
    if ctx.device != "cpu":  # gloo on the CPU; a GPU session would measure NCCL instead
        ctx.skip("distributed", case, "CPU (gloo) only so far")
        return []
    if ctx.quick:  # starting two ranks alone takes about 15 s on 2 cores
        ctx.skip("distributed", case, "not in a quick run (starting the ranks takes about 15 s)")
        return []
    return [(case, lambda c: run(c, n)), (HOST_CASE, run_host)]


def run(ctx, n):
    shapes = workloads.scaled(workloads.model_like_shapes(n), ctx.scale)
    rank0 = harness.run_ranks(_worker, WORLD, shapes, ctx.reps)[0]
    total = workloads.n_params(shapes)
    records = harness.make_records("distributed", f"fsdp2-adam/{total // 1_000_000}M", "cpu", "bfloat16",
                                   total, len(shapes), rank0["times"], ctx.ceiling_gbps, None,
                                   {k: {"held_bytes": v} for k, v in rank0["held_bytes"].items()})
    d = WORLD
    held = {k: v / total for k, v in rank0["held"].items()}
    ctx.note("distributed", f"bytes per param held by each of {d} ranks (params, grads, optimizer state; "
             "measured): " + ", ".join(f"{k} {v:.1f}" for k, v in held.items())
             + f"; Megatron's distributed optimizer (bf16 params, fp32 grads): 6 + 12/d = {6 + 12 / d:.1f}")
    return records


def _shard(full, mesh, requires_grad):
    from torch.distributed.tensor import Shard, distribute_tensor
    t = distribute_tensor(full, mesh, [Shard(0)])
    return torch.nn.Parameter(t, requires_grad=requires_grad) if requires_grad else t


def _local(t):
    """A DTensor's local shard (a view of it); any other tensor as it is."""
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


def _grad_restorer(params):
    """A function that copies the params' grads (their local shards) back to the values they
    hold now. Run before every timed step: the step unscales the grads in place (torch's fused
    optimizers as ours), and grads divided by the scale step after step underflow to zero within
    a few dozen steps, which a training step's fresh grads never are."""
    targets = [_local(p.grad) for p in params]
    saved = [t.clone() for t in targets]
    return lambda: torch._foreach_copy_(targets, saved)


def _local_bytes(tensors):
    return harness.tensor_bytes(map(_local, tensors))


def _held(params, opt):
    return _local_bytes(list(params) + [p.grad for p in params] +
                        [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)])


def _worker(rank, world, shapes, reps):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.optim import ZeroRedundancyOptimizer

    import fused_amp

    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(s, generator=gen) for s in shapes]
    grads = [torch.randn(s, generator=gen) * INIT_SCALE for s in shapes]

    def build(kind):
        """(step, params, optimizer) of one setting; grads scaled by INIT_SCALE."""
        if kind in ("fused_amp", "torch_fused"):
            dtype = torch.bfloat16 if kind == "fused_amp" else torch.float32
            params = [_shard(v.to(dtype), mesh, True) for v in values]
            for p, g in zip(params, grads):
                p.grad = _shard(g.to(dtype), mesh, False)
            opt = (fused_amp.optim.Adam(params, lr=1e-3) if kind == "fused_amp"
                   else torch.optim.Adam(params, lr=1e-3, fused=True))
            scaler = (fused_amp.GradScaler if kind == "fused_amp" else torch.amp.GradScaler)(
                "cpu", init_scale=INIT_SCALE)
        else:  # zero1 / ddp: full bf16 params on every rank, our masters
            params = [torch.nn.Parameter(v.bfloat16()) for v in values]
            for p, g in zip(params, grads):
                p.grad = g.bfloat16()
            opt = (ZeroRedundancyOptimizer(params, optimizer_class=fused_amp.optim.Adam, lr=1e-3)
                   if kind == "zero1" else fused_amp.optim.Adam(params, lr=1e-3))
            scaler = fused_amp.GradScaler("cpu", init_scale=INIT_SCALE)
        scaler.scale(torch.ones(()))

        def step():
            scaler.step(opt)
            scaler.update()
        return step, params, opt

    steps = {k: build(k) for k in ("fused_amp", "torch_fused")}
    restores = {k: _grad_restorer(params) for k, (_, params, _) in steps.items()}
    times = {k: [] for k in steps}
    for rep in range(2 + reps):  # in turns, the first two as warm-up
        for kind, (step, _, _) in steps.items():
            restores[kind]()
            dist.barrier()
            t = harness.time_once(step, "cpu")
            if rep >= 2:
                times[kind].append(t)
    held = {"FSDP2 fp32 shards (torch Adam)": _held(steps["torch_fused"][1], steps["torch_fused"][2]),
            "FSDP2 bf16 shards + fp32 masters": _held(steps["fused_amp"][1], steps["fused_amp"][2])}
    held_bytes = {"fused_amp": held["FSDP2 bf16 shards + fp32 masters"],
                   "torch_fused": held["FSDP2 fp32 shards (torch Adam)"]}
    del steps
    for kind, label in (("zero1", "ZeRO-1 bf16 + masters"), ("ddp", "DDP bf16 + masters")):
        step, params, opt = build(kind)
        step()  # creates the state (ZeRO: on the owning rank only)
        held[label] = _held(params, opt.optim if kind == "zero1" else opt)
    return dict(times=times, held=held, held_bytes=held_bytes)


# ---- host time per param: 200 blocks of Linear(64, 64) + LayerNorm(64), 800 params ---------------
BLOCKS = 200
HOST_CASE = f"fsdp2-host/{BLOCKS * 4}-params"


def _blocks(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
                                 for _ in range(BLOCKS)]).to(dtype)


# fused_amp's recipes on the same shards, each also on plain tensors shaped like the rank's local
# shards: name -> (optimizer class name, options). Lion and Muon as they land; Muon steps the
# Linear weights (its 2-D params) with Newton-Schulz replaced by the identity, so that its row
# times the rest of its step: under FSDP2 the exchange of whole matrices (the compute it leaves
# out is the same on both paths, and on a GPU a Tensor Core product chain).
EIGHT_BIT = dict(state_dtype=torch.uint8, min_8bit_size=0)  # the 64-element params too
RECIPES = {
    "": ("AdamW", {}),
    "clip": ("AdamW", dict(max_grad_norm=1.0)),
    "remainder": ("AdamW", dict(master_weights="remainder")),
    "remainder + 8-bit state": ("AdamW", dict(master_weights="remainder", **EIGHT_BIT)),
    "24-bit + 8-bit state": ("AdamW", dict(master_weights="remainder8", rounding_seed=0, **EIGHT_BIT)),
    "Lion": ("Lion", {}),
    "Muon, no Newton-Schulz": ("Muon", {}),
}


FLAG_ROW = "all_reduce of the flag"
MUON_EXCHANGE = "Muon's exchange of whole matrices"
STEPS_PER_TURN = 20  # each row's steps per turn, the median timed


def row_names(recipe):
    """(FSDP2 row, plain-tensor row) of a recipe."""
    if not recipe:
        return "fused_amp", "fused_amp[plain tensors]"
    return f"fused_amp[{recipe}]", f"fused_amp[{recipe}, plain tensors]"


def host_rows():
    """The case's rows, in the order the worker times them."""
    yield "torch_fused"
    for recipe in RECIPES:
        yield from row_names(recipe)
    yield from (FLAG_ROW, MUON_EXCHANGE)


def run_host(ctx):
    """Scaler step + update per rank (median of each rep's steps), in turns: each of fused_amp's
    RECIPES on bf16 shards (fp32 masters unless the recipe says otherwise), each also on plain
    tensors shaped like the rank's local shards (the same elements and count, no DTensor), and
    torch's fused AdamW on fp32 shards under torch's GradScaler. A recipe's FSDP2 row less its
    plain row is what the DTensor path costs it on the host per param, one all-reduce of the
    overflow flag per step among it, and for Muon the exchange of whole matrices (both timed alone
    beside them). Each row in wall time and in the CPU time of the stepping thread: the host work a
    GPU's step would wait for, without the waits for the other rank that gloo's blocking
    collectives add."""
    rank0 = harness.run_ranks(_host_worker, WORLD, ctx.reps)[0]
    counts, elements = rank0["n_tensors"], rank0["elements"]  # per row: Muon's rows step the 200 weights
    records = harness.make_records("distributed", HOST_CASE, "cpu", "bfloat16", elements["fused_amp"],
                                   counts["fused_amp"], rank0["times"], None, None)
    per_param, cpu_per_param = ({k: statistics.median(v) * 1e6 / counts[k] for k, v in rank0[key].items()}
                                for key in ("times", "cpu_times"))  # s -> us
    for rec in records:
        rec.update(n_params=elements[rec["impl"]], n_tensors=counts[rec["impl"]],
                   gparams_per_s=elements[rec["impl"]] / (rec["time_ms"] * 1e-3) / 1e9,
                   host_us_per_param=per_param[rec["impl"]], host_cpu_us_per_param=cpu_per_param[rec["impl"]])

    runs = ctx.per_run.setdefault(HOST_CASE, [])
    runs.append((per_param, cpu_per_param))
    ctx.note("distributed host time", _host_note(runs))
    return records


def _host_note(runs):
    """The summary's line on the host time per param: each row's median over the runs so far,
    and each gap's (FSDP2 row less its plain row) and torch's ratio's median and range over
    them, as the records report their medians."""
    def over_runs(values, fmt="+.1f", unit=""):  # one value per run -> "median (low..high)"
        m = f"{statistics.median(values):{fmt}}{unit}"
        return f"{m} ({min(values):{fmt}}..{max(values):{fmt}}{unit})" if len(values) > 1 else m

    def rows(col):
        return ", ".join(f"{k} {statistics.median(run[col][k] for run in runs):.1f}" for k in runs[0][col])

    def gaps(col):
        return ", ".join(f"{recipe or 'fp32 masters'} " + over_runs([run[col][a] - run[col][b] for run in runs])
                         for recipe, (a, b) in ((r, row_names(r)) for r in RECIPES))

    def muon_less_exchange(col):
        fsdp, plain = row_names("Muon, no Newton-Schulz")
        return over_runs([run[col][fsdp] - run[col][plain] - run[col][MUON_EXCHANGE] for run in runs])

    def ratio(col):
        return over_runs([run[col]["torch_fused"] / run[col]["fused_amp"] for run in runs], ".1f", "x")
    return (f"{HOST_CASE} per param per rank (us), median of {len(runs)} run(s), wall time: {rows(0)}; the "
            f"stepping thread's CPU time: {rows(1)}; FSDP2 - plain tensors per param (range over the runs), "
            f"wall: {gaps(0)}; CPU time: {gaps(1)} us (wall time adds the waits in gloo's collectives for "
            "the other rank, which NCCL's stream-ordered ones do not make the host wait for); alone, the "
            "flag's all-reduce (once per step, whatever the param count) and Muon's exchange of whole "
            "matrices (DTensor's redistribution, per matrix) are rows of their own; Muon's gaps less the "
            f"exchange {muon_less_exchange(0)} wall, {muon_less_exchange(1)} CPU; torch_fused / fused_amp: "
            f"{ratio(0)} wall, {ratio(1)} CPU")


def _timed(fn):
    """(wall seconds, the calling thread's CPU seconds) of one call of ``fn``."""
    cpu, wall = time.thread_time(), time.perf_counter()
    fn()
    return time.perf_counter() - wall, time.thread_time() - cpu


def _host_worker(rank, world, reps):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    import fused_amp
    from fused_amp.benchmark.suites.muon import identity_ns
    from fused_amp.optim import _whole_matrices

    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))

    def sharded(dtype):
        model = _blocks(dtype)
        for block in model:
            fully_shard(block)
        fully_shard(model)
        # DTensor grads, scaled as the scaler's scaled loss would leave them
        (model(x.to(dtype)).float().square().mean() * INIT_SCALE).backward()
        return list(model.parameters())

    def plain_like(shards):
        """Plain params and grads with the values and shapes of this rank's local shards."""
        params = [torch.nn.Parameter(p.to_local().detach().clone()) for p in shards]
        for p, q in zip(params, shards):
            p.grad = q.grad.to_local().clone()
        return params

    def build(params, cls=None, **kw):
        """(A scaler step + update, the params it steps): fused_amp's ``cls`` with ``kw``; torch's
        fused AdamW if None."""
        if cls is None:
            opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
        else:
            if cls is fused_amp.optim.Muon:
                params = [p for p in params if p.ndim == 2]
            opt = cls(params, lr=1e-4, **kw)
        scaler = (torch.amp.GradScaler if cls is None else fused_amp.GradScaler)("cpu", init_scale=INIT_SCALE)
        scaler.scale(torch.ones(()))

        def step():
            with identity_ns("fused_amp") if cls is fused_amp.optim.Muon else contextlib.nullcontext():
                scaler.step(opt)
            scaler.update()
        return step, params

    flag = torch.zeros(())
    steps = {"torch_fused": build(sharded(torch.float32))}
    for recipe, (cls_name, kw) in RECIPES.items():  # each its own model: its own state
        cls = getattr(fused_amp.optim, cls_name)
        shards = sharded(torch.bfloat16)
        fsdp_row, plain_row = row_names(recipe)
        steps[fsdp_row] = build(shards, cls, **kw)
        steps[plain_row] = build(plain_like(shards), cls, **kw)
    restores = {k: _grad_restorer(params) for k, (_, params) in steps.items()}
    # what every FSDP2 step adds whatever the param count: the overflow flag's MAX all-reduce
    steps[FLAG_ROW] = (lambda: dist.all_reduce(flag, op=dist.ReduceOp.MAX), steps["fused_amp"][1])
    # what Muon's FSDP2 step adds in bytes: its stack of the Linear weights' row shards to the
    # ranks owning the whole matrices and back (per Linear weight)
    weights = [p for p in shards if p.ndim == 2]
    stack = torch.randn((len(weights),) + tuple(weights[0].to_local().shape)).bfloat16()
    steps[MUON_EXCHANGE] = (lambda: _whole_matrices.from_owners(
        _whole_matrices.to_owners(stack, weights[0]), weights[0], len(weights)), weights)
    assert list(steps) == list(host_rows())
    times, cpu_times = {k: [] for k in steps}, {k: [] for k in steps}
    for rep in range(2 + reps):  # in turns, the first two as warm-up
        for kind, (step, _) in steps.items():
            restore = restores.get(kind, lambda: None)
            dist.barrier()
            ts = []
            for _ in range(STEPS_PER_TURN):
                restore()
                ts.append(_timed(step))
            if rep >= 2:
                times[kind].append(statistics.median(wall for wall, _ in ts))
                cpu_times[kind].append(statistics.median(cpu for _, cpu in ts))
    assert all(isinstance(p, DTensor) for p in shards)  # (the last recipe's, all 800 params)
    return dict(times=times, cpu_times=cpu_times, n_tensors={k: len(params) for k, (_, params) in steps.items()},
                elements={k: sum(_local(p).numel() for p in params) for k, (_, params) in steps.items()})
