"""torch.distributed on CPU (gloo, several processes): DDP, ZeRO-1 and FSDP2 with our
optimizers and scaler. Each test starts its ranks with a free port and a deadline, so that a
hang fails."""
import copy
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

import fused_amp
from fused_amp.benchmark import harness
from fused_amp.optim._grad_norm import local_shard

DEADLINE_S = 120


def run_ranks(fn, world, *args):
    """fn(rank, world, *args) in ``world`` gloo ranks (fused_amp.benchmark.harness.run_ranks); a rank
    that fails or a run past the deadline fails the test."""
    try:
        return harness.run_ranks(fn, world, *args, deadline_s=DEADLINE_S)
    except RuntimeError as e:
        pytest.fail(str(e))


def failing_run(rank, world, how):
    # both ranks past the process group's set-up first: a rank that failed while the other was
    # still connecting made that one fail too (gloo's "Connection closed by peer"), and either
    # failure could be the one reported
    dist.barrier()
    if rank == 1:
        if how == "raise":
            raise ValueError("rank 1 fails")
        os.abort()
    time.sleep(DEADLINE_S)  # until the harness stops it, rank 1's failure being the one reported


@pytest.mark.parametrize("how,cause", [("raise", "ValueError: rank 1 fails"), ("abort", "signal SIGABRT")])
def test_a_failing_rank_fails_the_run_and_says_why(how, cause, capfd):
    """The harness's own contract, now that a finished rank leaves by os._exit: a rank that
    raises or dies of a signal still fails the run, and one killed by a signal prints its
    stacks (C++ and Python) on stderr."""
    with pytest.raises(RuntimeError, match="a rank failed") as e:
        harness.run_ranks(failing_run, 2, how, deadline_s=DEADLINE_S)
    assert cause in str(e.value)
    if how == "abort":
        err = capfd.readouterr().err
        assert "SIGABRT(6), PID" in err and "Fatal Python error: Aborted" in err


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).bfloat16()


def batch(rank, step, overflow_at):
    gen = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(8, 16, generator=gen).bfloat16()
    if step == overflow_at and rank == 1:  # an inf on one rank only
        x[0, 0] = float("inf")
    return x


def train(rank, model, opt, steps, overflow_at, data_rank=None):
    """``data_rank``: every rank trains on that rank's batches (an exact average in DDP)."""
    scaler = fused_amp.GradScaler("cpu", init_scale=256.0)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        x = batch(rank if data_rank is None else data_rank, step, overflow_at)
        loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return scaler


def ddp_run(rank, world, steps, overflow_at, data_rank=None, max_grad_norm=None):
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-2, max_grad_norm=max_grad_norm)
    scaler = train(rank, model, opt, steps, overflow_at, data_rank)
    return dict(params=[p.detach().clone() for p in model.parameters()],
                masters=[opt.state[p]["master_param"].clone() for p in model.parameters()],
                steps=[opt.state[p]["step"].item() for p in model.parameters()],
                scale=scaler.get_scale(),
                grad_norm=None if opt.last_grad_norm is None else opt.last_grad_norm.item())


@pytest.mark.parametrize("world,max_grad_norm", [(2, None), (4, None), (2, 0.05)])
def test_ddp_ranks_stay_bitwise_equal_through_an_overflow_on_one_rank(world, max_grad_norm):
    """(with max_grad_norm: the norm of DDP's averaged grads is the same on every rank, so the
    clipped steps are too)"""
    results = run_ranks(ddp_run, world, 6, 3, None, max_grad_norm)
    if max_grad_norm is not None:
        assert all(r["grad_norm"] == results[0]["grad_norm"] > max_grad_norm for r in results)
    for other in results[1:]:
        for key in ("params", "masters"):
            for a, b in zip(other[key], results[0][key]):
                assert torch.equal(a, b), key
        assert other["steps"] == results[0]["steps"] and other["scale"] == results[0]["scale"]
    assert results[0]["steps"] == [5.0] * 4  # every rank skipped the overflow step
    assert results[0]["scale"] == 128.0


def test_ddp_equals_a_single_process_run_of_the_same_global_batch():
    """Every rank gets the same half of a global batch made of two equal halves: the averaged
    grad is then exact, so 2 ranks must give the single-process run's params bit for bit."""
    ranks = run_ranks(ddp_run, 2, 4, None, 0)
    model = make_model()
    opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-2)
    train(0, model, opt, 4, None)
    for r in ranks:
        for a, b in zip(r["params"], model.parameters()):
            assert torch.equal(a, b.detach())
        for a, b in zip(r["masters"], model.parameters()):
            assert torch.equal(a, opt.state[b]["master_param"])


def zero_run(rank, world, steps, overflow_at):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    # the generic path (a host sync, grads unscaled in place) must not be taken
    def refuse(*args, **kwargs):
        raise AssertionError("GradScaler took the generic path with ZeRO")
    fused_amp.GradScaler._maybe_opt_step = refuse
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=fused_amp.optim.AdamW, lr=1e-2)
    train(rank, model, opt, steps, overflow_at)
    owned = [p for p in model.parameters() if p in opt.optim.state]
    opt.consolidate_state_dict(to=0)
    # a checkpoint's copy: on the CPU, ZeRO's state_dict() shares the live state tensors
    full = copy.deepcopy(opt.state_dict()) if rank == 0 else None
    # reload the consolidated state into a fresh ZeRO on every rank, and both continue alike
    objs = [full]
    dist.broadcast_object_list(objs, src=0)
    twin_model = torch.nn.parallel.DistributedDataParallel(make_model())
    with torch.no_grad():
        for a, b in zip(twin_model.parameters(), model.parameters()):
            a.copy_(b)
    twin = ZeroRedundancyOptimizer(twin_model.parameters(), optimizer_class=fused_amp.optim.AdamW, lr=1e-2)
    twin.load_state_dict(objs[0])
    train(rank, model, opt, 2, None)
    train(rank, twin_model, twin, 2, None)
    return dict(params=[p.detach().clone() for p in model.parameters()],
                twin=[p.detach().clone() for p in twin_model.parameters()],
                owned=len(owned), n_params=len(list(model.parameters())),
                masters_owned=sum("master_param" in opt.optim.state[p] for p in owned))


def test_zero1_takes_the_sync_free_path_shards_state_and_round_trips():
    results = run_ranks(zero_run, 2, 5, 2)
    for r in results:
        for a, b in zip(r["params"], results[0]["params"]):
            assert torch.equal(a, b)  # ranks equal, through an overflow on one rank
        for a, b in zip(r["twin"], r["params"]):
            assert torch.equal(a, b)  # consolidate + state_dict + load_state_dict continues alike
        assert 0 < r["owned"] < r["n_params"] and r["masters_owned"] == r["owned"]
    assert sum(r["owned"] for r in results) == results[0]["n_params"]  # each param on one rank


# ---- FSDP2 (fully_shard: DTensor params and grads) ---------------------------------------------

def fsdp_run(rank, world, recipe, dtype, overflow_at, mixed=False, max_norm=None):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(dtype)
    # mixed: fp32 shards, computed in bf16, grads reduced in fp32
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **({"mp_policy": policy} if mixed else {}))
    fully_shard(model, **({"mp_policy": policy} if mixed else {}))
    params = list(model.parameters())
    optimizer, scaler_cls = {
        "ours": (lambda: fused_amp.optim.Adam(params, lr=1e-2, max_grad_norm=max_norm), fused_amp.GradScaler),
        "torch_opt_our_scaler": (lambda: torch.optim.Adam(params, lr=1e-2, fused=True), fused_amp.GradScaler),
        "torch": (lambda: torch.optim.Adam(params, lr=1e-2, fused=True), torch.amp.GradScaler),
        "torch_foreach": (lambda: torch.optim.Adam(params, lr=1e-2, foreach=True), torch.amp.GradScaler),
    }[recipe]
    opt, scaler = optimizer(), scaler_cls("cpu", init_scale=256.0)
    norms = []
    for step in range(5):
        opt.zero_grad()
        x = batch(rank, step, overflow_at).to(torch.bfloat16 if mixed else dtype)
        scaler.scale(model(x).float().pow(2).mean()).backward()
        if max_norm is not None and recipe != "ours":  # torch's recipe
            scaler.unscale_(opt)
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=recipe == "torch_foreach")
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        scaler.step(opt)
        scaler.update()
        if max_norm is not None and recipe == "ours":
            norms.append(opt.last_grad_norm)
    out = dict(local=[p.to_local().clone() for p in params], full=[p.full_tensor() for p in params],
               scale=scaler.get_scale(), steps=[float(opt.state[p]["step"]) for p in params],
               norms=[float(n) for n in norms])
    if "master_param" in opt.state[params[0]]:
        masters = [opt.state[p]["master_param"] for p in params]
        out["masters_sharded_like_params"] = all(
            isinstance(m, DTensor) and m.placements == p.placements and m.device_mesh == p.device_mesh
            for m, p in zip(masters, params))
        out["params_are_rounded_masters"] = all(
            torch.equal(p.full_tensor(), m.full_tensor().to(p.dtype)) for m, p in zip(masters, params))
    return out


@pytest.mark.parametrize("recipe", ["ours", "torch_opt_our_scaler"])
def test_fsdp2_fp32_shards_step_as_torch_and_skip_together(recipe):
    """fp32 sharded params, through an overflow on one rank that every rank skips. torch's fused
    Adam under our scaler gives torch's results bitwise; our Adam stays as close to torch's
    fused Adam as torch's foreach Adam is (at least one fp32 ulp), the optimizers' contract."""
    ours = run_ranks(fsdp_run, 2, recipe, torch.float32, 2)
    theirs = run_ranks(fsdp_run, 2, "torch", torch.float32, None)
    clean = run_ranks(fsdp_run, 2, recipe, torch.float32, None)
    foreach = run_ranks(fsdp_run, 2, "torch_foreach", torch.float32, None) if recipe == "ours" else theirs
    for o, c, t, f in zip(ours, clean, theirs, foreach):
        for a, b, fe in zip(c["local"], t["local"], f["local"]):
            # the rule of test_optim.py's parity test: max distance within torch's own spread
            spread = max((fe - b).abs().max().item(), torch.finfo(torch.float32).eps * b.abs().max().item())
            assert (a - b).abs().max().item() <= spread if recipe == "ours" else torch.equal(a, b)
        assert o["steps"] == [4.0] * len(o["steps"]) and o["scale"] == 128.0  # both ranks skipped once
        for a, b in zip(o["full"], ours[0]["full"]):
            assert torch.equal(a, b)


def test_fsdp2_clipping_by_the_global_norm_of_the_shards():
    """max_grad_norm on FSDP2 shards: every rank computes the norm of the whole model (its
    shards' sums combined over the mesh), the one torch's clip_grad_norm_ gives, and the params
    stay within torch's own fused/foreach spread of torch's fused recipe, with a floor of two
    fp32 ulps: two norms each within an ulp of the exact one clip by coefficients that far apart."""
    ours, fused, foreach = (run_ranks(fsdp_run, 2, recipe, torch.float32, None, False, 0.05)
                            for recipe in ("ours", "torch", "torch_foreach"))
    assert ours[0]["norms"] == ours[1]["norms"]
    for a, b, c in zip(ours[0]["norms"], fused[0]["norms"], foreach[0]["norms"]):
        assert b > 0.05  # every step clips
        assert abs(a - b) <= max(abs(b - c), 2 * torch.finfo(torch.float32).eps * b)
    for o, t, f in zip(ours, fused, foreach):
        for a, b, fe in zip(o["local"], t["local"], f["local"]):
            spread = max((fe - b).abs().max().item(), 2 * torch.finfo(torch.float32).eps * b.abs().max().item())
            assert (a - b).abs().max().item() <= spread


def test_fsdp2_mixed_precision_policy_fp32_shards():
    """MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) over fp32 shards: our Adam and
    scaler stay within torch's own fused/foreach spread of torch's fused Adam, ranks agree."""
    ours, fused, foreach = (run_ranks(fsdp_run, 2, recipe, torch.float32, None, True)
                            for recipe in ("ours", "torch", "torch_foreach"))
    for o, t, f in zip(ours, fused, foreach):
        for a, b, fe in zip(o["local"], t["local"], f["local"]):
            spread = max((fe - b).abs().max().item(), torch.finfo(torch.float32).eps * b.abs().max().item())
            assert (a - b).abs().max().item() <= spread
        for a, b in zip(o["full"], ours[0]["full"]):
            assert torch.equal(a, b)


def every_optimizer_ddp_and_zero_run(rank, world):
    """Each optimizer of the registry (its stateful option set) under DDP and under ZeRO-1
    (ZeroRedundancyOptimizer over DDP) with fused_amp's GradScaler, an overflow on rank 1 at
    step 2: the ZeRO run (each rank steps the params it owns, then broadcasts them) must leave
    the params of the DDP run bit for bit, and the ranks must agree."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from optim_registry import OPTIMIZERS

    out = {}
    for entry in OPTIMIZERS:
        kw = entry.options[1]
        runs = []
        for zero in (False, True):
            model = torch.nn.parallel.DistributedDataParallel(make_model())
            opt = (ZeroRedundancyOptimizer(model.parameters(), optimizer_class=entry.ours, **kw) if zero
                   else entry.ours(model.parameters(), **kw))
            train(rank, model, opt, 4, 2)
            runs.append([p.detach().clone() for p in model.parameters()])
        out[entry.ours.__name__] = (all(torch.equal(a, b) for a, b in zip(*runs)), runs[0])
    return out


def test_every_optimizer_steps_alike_under_ddp_and_zero1():
    results = run_ranks(every_optimizer_ddp_and_zero_run, 2)
    for name, (zero_equals_ddp, params) in results[0].items():
        assert zero_equals_ddp, name
        assert all(torch.equal(a, b) for a, b in zip(params, results[1][name][1])), name


def every_optimizer_fsdp_run(rank, world):
    """Each optimizer of the registry (its stateful option set) over FSDP2's bf16 shards with
    fp32 masters (bf16 training, no scaler), beside the same optimizer over plain full copies of
    the params given the full (reduce-scattered, gathered) grads: the shards must step as the
    whole tensors do, bit for bit (an elementwise step does not see where a shard ends)."""
    from optim_registry import OPTIMIZERS

    out = {}
    for entry in OPTIMIZERS:
        model = sharded_mlp(32, 4)
        params = list(model.parameters())
        whole = [torch.nn.Parameter(p.full_tensor().detach().clone()) for p in params]
        start = [w.detach().clone() for w in whole]
        kw = entry.options[1]
        opt, twin = entry.ours(params, **kw), entry.ours(whole, **kw)
        for step in range(3):
            opt.zero_grad()
            model(batch(rank, step, None)).float().pow(2).mean().backward()
            for w, p in zip(whole, params):
                w.grad = p.grad.full_tensor()
            opt.step()
            twin.step()
        out[entry.ours.__name__] = (all(torch.equal(p.full_tensor(), w.detach()) for p, w in zip(params, whole))
                                    and not all(torch.equal(w.detach(), s) for w, s in zip(whole, start)))
    return out


def test_every_optimizer_steps_fsdp2_shards_as_whole_tensors():
    for r in run_ranks(every_optimizer_fsdp_run, 2):
        assert all(r.values()), [name for name, same in r.items() if not same]


def test_fsdp2_bf16_shards_with_fp32_masters_sharded_like_the_params():
    results = run_ranks(fsdp_run, 2, "ours", torch.bfloat16, 3)
    for r in results:
        assert r["masters_sharded_like_params"] and r["params_are_rounded_masters"]
        assert r["steps"] == [4.0] * len(r["steps"]) and r["scale"] == 128.0
        for a, b in zip(r["full"], results[0]["full"]):
            assert torch.equal(a, b)


def swapped_local_run(rank, world):
    """fp32 DTensor params (sharded as FSDP2 shards them) stepped once, then each swapped for
    another DTensor with torch.utils.swap_tensors (what model.to() does with
    torch.__future__.set_swap_module_params_on_conversion(True): the same Python object, another
    local tensor), then stepped again: the step must update the new local tensors, not the ones
    the optimizer's cached lists held."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(distribute_tensor(torch.randn(8, 4, generator=gen), mesh, [Shard(0)]))
              for _ in range(3)]
    opt = fused_amp.optim.Adam(params, lr=0.1)

    def set_grads():
        for p in params:
            p.grad = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])

    set_grads()
    opt.step()
    old = [p.to_local() for p in params]
    old_values = [t.clone() for t in old]
    for p in params:
        fresh = torch.nn.Parameter(distribute_tensor(torch.full((8, 4), 5.0), mesh, [Shard(0)]))
        torch.utils.swap_tensors(p, fresh)
    set_grads()
    opt.step()
    return dict(old_unchanged=all(torch.equal(a, b) for a, b in zip(old, old_values)),
                new_stepped=[p.to_local().clone() for p in params])


def test_a_swapped_local_tensor_rebuilds_the_cached_lists():
    for r in run_ranks(swapped_local_run, 2):
        assert r["old_unchanged"]
        for t in r["new_stepped"]:  # 5.0 less Adam's second step with constant grads: 5 - 0.1
            torch.testing.assert_close(t, torch.full_like(t, 4.9))


def sharded_mlp(hidden, out):
    """bf16 Linear(16, hidden), Tanh, Linear(hidden, out), each Linear and the whole fully_shard'ed."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, out)).bfloat16()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def dcp_run(rank, world, path, phase, options=None):
    """bf16 params with fp32 masters under FSDP2; every rank trains on the same batch, so the
    averaged grads are exact for any world size and runs on 4 and 2 ranks can be compared bit
    for bit. "save": 3 steps, a DCP checkpoint (model, optimizer) and the scaler's state, 2 more
    steps. "load": the checkpoint loaded, the same 2 steps. ``options``: the optimizer's memory
    options; with 8-bit state the load also says whether each rank's codes are its local shards
    of the checkpoint's fp32 moments, quantized."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from fused_amp.optim._quantize import ABSMAX, quantize

    model = sharded_mlp(32, 4)
    opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-2, **(options or {}))
    out = {}
    scaler = fused_amp.GradScaler("cpu", init_scale=256.0, hysteresis=2)

    def steps(which):
        for step in which:
            opt.zero_grad()
            x = batch(0, step, None)  # the same batch on every rank
            scaler.scale(model(x).float().pow(2).mean()).backward()
            scaler.step(opt)
            scaler.update()

    if phase == "save":
        steps(range(3))
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
        if rank == 0:
            torch.save(scaler.state_dict(), os.path.join(path, "scaler.pt"))
        dist.barrier()
    else:
        model_sd, optim_sd = get_state_dict(model, opt)  # the structure to load into
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        scaler.load_state_dict(torch.load(os.path.join(path, "scaler.pt")))
        state_dtype = (options or {}).get("state_dtype")
        if state_dtype in (torch.uint8, torch.uint4):
            checks = []
            for name, p in model.named_parameters():
                saved, mine = state["optim"]["state"][name], opt.state[p]
                for row, (key, signed) in enumerate((("exp_avg", True), ("exp_avg_sq", False))):
                    codes, absmax = quantize(saved[key].to_local(), p.to_local(), signed, state_dtype)
                    checks.append(torch.equal(local_shard(mine[key]), codes)
                                  and torch.equal(mine[ABSMAX][row], absmax))
            out["loaded_codes_are_the_shards_quantized"] = all(checks)
    steps(range(3, 5))
    params = list(model.parameters())
    # fp32 moments as state_dict() gives them (8-bit codes dequantized)
    moments = opt.state_dict()["state"]
    return dict(out, params=[p.full_tensor() for p in params],
                masters=[opt.state[p]["master_param"].full_tensor() for p in params],
                exp_avg=[moments[i]["exp_avg"].full_tensor() for i in range(len(params))],
                steps=[float(opt.state[p]["step"]) for p in params], scale=scaler.get_scale())


def test_fsdp2_dcp_checkpoint_saved_on_4_ranks_continues_on_2():
    with tempfile.TemporaryDirectory() as path:
        saved = run_ranks(dcp_run, 4, path, "save")
        loaded = run_ranks(dcp_run, 2, path, "load")
    for r in loaded:
        for key in ("params", "masters", "exp_avg"):
            for a, b in zip(r[key], saved[0][key]):
                assert torch.equal(a, b), key
        assert r["steps"] == saved[0]["steps"] == [5.0] * 4 and r["scale"] == saved[0]["scale"]


# the largest gap between neighbouring codes of exp_avg, relative to the block's absmax: 8-bit
# 1/127 at the top (csrc/ops/quantize.h), 4-bit 0.225 (torchao's map, csrc/ops/quantize4.h)
CODE_GAP = {torch.uint8: 1 / 127, torch.uint4: 0.8875 - 0.6625}


@pytest.mark.parametrize("state_dtype", [torch.uint8, torch.uint4], ids=str)
def test_fsdp2_dcp_checkpoint_with_codes_saved_on_4_ranks_continues_on_2(state_dtype):
    """The checkpoint holds fp32 moments (DTensors); loaded on 2 ranks each rank quantizes its
    own shards, in blocks of its shard (not the 4-rank blocks): the codes (8- or 4-bit) are those
    of the checkpoint's values, the masters and step counts are the checkpoint's exactly, and the
    run continues. The moments then differ from the 4-rank run's by the requantization only:
    within two code steps of each other."""
    options = dict(state_dtype=state_dtype, min_8bit_size=0)
    with tempfile.TemporaryDirectory() as path:
        saved = run_ranks(dcp_run, 4, path, "save", options)
        loaded = run_ranks(dcp_run, 2, path, "load", options)
    for r in loaded:
        assert r["loaded_codes_are_the_shards_quantized"]
        assert r["steps"] == saved[0]["steps"] == [5.0] * 4 and r["scale"] == saved[0]["scale"]
        for a, b in zip(r["exp_avg"], saved[0]["exp_avg"]):
            assert (a - b).abs().max().item() <= 2 * b.abs().max().item() * CODE_GAP[state_dtype]
        for a, b in zip(r["params"], loaded[0]["params"]):
            assert torch.equal(a, b)  # the ranks agree


def fsdp_codes_run(rank, world, master_weights, state_dtype):
    """bf16 FSDP2 shards with 8- or 4-bit state through an overflow on one rank; then one more
    step beside an fp32-state twin loaded from this optimizer's state_dict() (fp32 moments,
    DTensors): the twin's step from the dequantized state gives the same params and masters bit
    for bit, and this optimizer's new codes are the twin's new local moments quantized shard by
    shard. 8-bit codes are DTensors placed as the param, 4-bit ones each rank's own 1-D bytes."""
    from torch.distributed.tensor import DTensor

    from fused_amp.optim._quantize import ABSMAX, block_of, blocks_of, quantize

    # 64 x 16 weights: 512 elements (2 quant blocks) per rank; 3 x 64: uneven shards (2 and 1 rows)
    model = sharded_mlp(64, 3)
    params = list(model.parameters())
    options = dict(lr=1e-2, master_weights=master_weights, rounding_seed=7)
    opt = fused_amp.optim.AdamW(params, state_dtype=state_dtype, min_8bit_size=0, **options)
    scaler = fused_amp.GradScaler("cpu", init_scale=256.0)
    for step in range(4):
        opt.zero_grad()
        scaler.scale(model(batch(rank, step, 2)).float().pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
    # (a rank's one-element shard keeps fp32 state with 4-bit codes: they would read as 8-bit ones)
    coded = [p for p in params if state_dtype == torch.uint8 or p.to_local().numel() > 1]
    coded_ids = {id(p) for p in coded}
    if state_dtype == torch.uint8:
        layout = all(isinstance(opt.state[p][k], DTensor) and opt.state[p][k].placements == p.placements
                     and opt.state[p][k].dtype == torch.uint8 for p in params for k in ("exp_avg", "exp_avg_sq"))
    else:
        layout = all(type(opt.state[p][k]) is torch.Tensor and opt.state[p][k].dtype == torch.uint8
                     and opt.state[p][k].shape == ((p.to_local().numel() + 1) // 2,)
                     for p in coded for k in ("exp_avg", "exp_avg_sq"))
        layout &= all(opt.state[p]["exp_avg"].dtype == torch.float32 for p in params if id(p) not in coded_ids)
    layout &= all(type(opt.state[p][ABSMAX]) is torch.Tensor
                  and opt.state[p][ABSMAX].shape == (2, blocks_of(p.to_local().numel(), block_of(state_dtype)))
                  for p in coded)
    twin_params = [torch.nn.Parameter(DTensor.from_local(p.to_local().clone(), p.device_mesh, p.placements,
                                                         shape=p.shape, stride=p.stride())) for p in params]
    twin = fused_amp.optim.AdamW(twin_params, **options)
    twin.load_state_dict(opt.state_dict())
    try:
        opt.state_dict(compact=True)
        compact_refused = False
    except ValueError as e:
        compact_refused = "cannot be resharded" in str(e)
    gen = torch.Generator().manual_seed(rank)
    for p, q in zip(params, twin_params):
        g = torch.randn(p.to_local().shape, generator=gen).bfloat16()
        p.grad = DTensor.from_local(g, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
        q.grad = DTensor.from_local(g.clone(), q.device_mesh, q.placements, shape=q.shape, stride=q.stride())
    opt.step()
    twin.step()
    same = all(torch.equal(p.to_local(), q.to_local()) for p, q in zip(params, twin_params))
    ours, theirs = opt.state_dict()["state"], twin.state_dict()["state"]
    same &= all(torch.equal(ours[i]["master_param"].to_local(), theirs[i]["master_param"].to_local())
                for i in range(len(params)))
    codes = []
    for p, q in zip(params, twin_params):
        if id(p) not in coded_ids:
            continue
        for row, (key, signed) in enumerate((("exp_avg", True), ("exp_avg_sq", False))):
            c, a = quantize(twin.state[q][key].to_local(), p.to_local(), signed, state_dtype)
            codes.append(torch.equal(local_shard(opt.state[p][key]), c) and torch.equal(opt.state[p][ABSMAX][row], a))
    return dict(layout=layout, same=same, codes=all(codes), compact_refused=compact_refused, steps=[float(opt.state[p]["step"]) for p in params],
                full=[p.full_tensor() for p in params])


@pytest.mark.parametrize("master_weights,state_dtype", [(True, torch.uint8), ("remainder", torch.uint8),
                                                        ("remainder8", torch.uint8), ("remainder", torch.uint4),
                                                        ("remainder8", torch.uint4)])
def test_fsdp2_codes_are_quantized_shard_by_shard(master_weights, state_dtype):
    results = run_ranks(fsdp_codes_run, 2, master_weights, state_dtype)
    for r in results:
        assert r["layout"] and r["same"] and r["codes"] and r["compact_refused"]
        assert r["steps"] == [4.0] * 4  # the overflow on rank 1 skipped on both
        for a, b in zip(r["full"], results[0]["full"]):
            assert torch.equal(a, b)


def test_the_fsdp2_example_runs_and_learns():
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, os.path.join(root, "examples", "fsdp2_train.py")],
                          capture_output=True, text=True, timeout=DEADLINE_S, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [float(line.split()[-1]) for line in proc.stdout.splitlines() if "loss" in line]
    assert losses[-1] < losses[0] / 10


def in_backward_fsdp_run(rank, world, bucket_bytes):
    """FSDP2 bf16 shards with exact masters (remainder): the post-accumulate hooks fire on each
    reduce-scattered grad shard, which steps there and is freed; the normal FSDP2 loop's params
    and state, bit for bit."""
    out = []
    for in_backward in (False, True):
        model = sharded_mlp(32, 4)
        opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-2, master_weights="remainder")
        handle = fused_amp.optim.step_in_backward(opt, bucket_bytes) if in_backward else None
        for step in range(4):
            model(batch(rank, step, None)).float().pow(2).mean().backward()
            if in_backward:
                assert all(p.grad is None for p in model.parameters())
            opt.step()
            opt.zero_grad()
        if handle is not None:
            handle.remove()
        out.append([p.full_tensor() for p in model.parameters()]
                   + [opt.state[p][k].full_tensor() for p in model.parameters() for k in ("exp_avg", "exp_avg_sq")])
    return all(torch.equal(a, b) for a, b in zip(*out))


def in_backward_ddp_run(rank, world):
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-2)
    try:
        fused_amp.optim.step_in_backward(opt)
    except RuntimeError as e:
        return str(e)


def test_ddp_is_refused_by_step_in_backward():
    for message in run_ranks(in_backward_ddp_run, 2):
        assert "is not a DTensor in a 2-rank run: under DDP the reducer averages the grads" in message


@pytest.mark.parametrize("bucket_bytes", [0, None])
def test_fsdp2_steps_in_backward_as_its_normal_loop(bucket_bytes):
    assert all(run_ranks(in_backward_fsdp_run, 2, bucket_bytes))
