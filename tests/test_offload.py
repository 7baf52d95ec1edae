"""fused_amp as the CPU optimizer of the offload engines: torchao's ``CPUOffloadOptimizer``
makes one optimizer per param and steps them one after another once their grads are on the
host; FSDP2's ``CPUOffloadPolicy`` keeps the sharded params on the host, where the optimizer
steps them. On the CPU, the pattern torchao's engine drives (the engine asserts a CUDA or XPU
device) and FSDP2's ``CPUOffloadPolicy(pin_memory=False)`` on gloo ranks; on a GPU (marked
cuda: ``make gpu-check``), torchao's engine itself and FSDP2's pinned offload."""
import copy
import math

import pytest
import torch
import torch.distributed as dist

import fused_amp
from helpers import assert_bitwise_equal
from optim_registry import CASES, IDS, STORAGE
from test_distributed import batch, run_ranks

SHAPES = [(64, 33), (4099,), (7,), (300, 20)]  # vector bodies and tails; one param two threads split


def grads_of(step, dtype):
    gen = torch.Generator().manual_seed(step)
    return [torch.randn(s, generator=gen).to(dtype) for s in SHAPES]


def give(optimizers, params, grads, found):
    """The grads to ``params``, and ``found`` as the found_inf that a GradScaler hands each
    optimizer (its scale 1)."""
    for p, g in zip(params, grads):
        p.grad = g.clone()
    for o in optimizers:
        o.found_inf, o.grad_scale = torch.tensor(found), torch.tensor(1.0)


@pytest.mark.parametrize("storage", list(STORAGE))
@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_one_optimizer_per_param_steps_as_one_optimizer(cls, torch_cls, kw, storage):
    """torchao's engine: per-param optimizers stepped one after another are bitwise one
    optimizer stepping every param, in every storage kind, through an overflow step."""
    dtype, options = STORAGE[storage]
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(s, generator=gen).to(dtype) for s in SHAPES]
    whole = [torch.nn.Parameter(v.clone()) for v in values]
    apart = [torch.nn.Parameter(v.clone()) for v in values]
    one = cls(whole, **kw, **options)
    each = [cls([p], **kw, **options) for p in apart]
    for step, found in enumerate([0.0, 1.0, 0.0, 0.0]):
        grads = grads_of(step, dtype)
        give([one], whole, grads, found)
        give(each, apart, grads, found)
        one.step()
        for o in each:
            o.step()
        for p, q, o in zip(whole, apart, each):
            assert_bitwise_equal(q, p, f"step {step}")
            for key, value in one.state[p].items():
                if isinstance(value, torch.Tensor):
                    assert_bitwise_equal(o.state[q][key], value, f"step {step}: {key}")


def torch_clipped_run(kw, max_norm, foreach):
    """torch's recipe: its AdamW (fused, or foreach) over every param after its clip_grad_norm_."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]
    opt = torch.optim.AdamW(params, **kw, **(dict(foreach=True) if foreach else dict(fused=True)))
    norms = []
    for step in range(3):
        for p, g in zip(params, grads_of(step, torch.float32)):
            p.grad = g
        norms.append(torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=foreach))
        opt.step()
    return params, norms


def test_one_norm_clips_every_per_param_optimizer_as_torch_clips_the_model():
    """torchao's engine has no clipping and each per-param optimizer sees its own grad only:
    ``fused_amp.optim.clip_grad_norm_`` over all of them clips by the model's one norm, as
    torch's clip_grad_norm_ over every param does, within torch's own fused/foreach spread
    (floor: two fp32 ulps of each value)."""
    kw, max_norm = dict(lr=1e-2, weight_decay=0.1), 0.5
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]
    each = [fused_amp.optim.AdamW([p], **kw) for p in params]
    norms = []
    for step in range(3):
        for p, g in zip(params, grads_of(step, torch.float32)):
            p.grad = g
        norms.append(fused_amp.optim.clip_grad_norm_(each, max_norm))
        for o in each:
            o.step()
    (fused, fused_norms), (foreach, foreach_norms) = (torch_clipped_run(kw, max_norm, f) for f in (False, True))
    eps = torch.finfo(torch.float32).eps
    for ours, theirs, other in zip(norms, fused_norms, foreach_norms):
        assert float(theirs) > max_norm  # every step clips
        assert abs(float(ours) - float(theirs)) <= max(abs(float(theirs) - float(other)), 2 * eps * float(theirs))
    for o in each:
        assert o.last_grad_norm is norms[-1] or torch.equal(o.last_grad_norm, norms[-1])
    for ours, theirs, other in zip(params, fused, foreach):
        spread = max((other - theirs).abs().max().item(), 2 * eps * theirs.abs().max().item())
        assert (ours - theirs).abs().max().item() <= spread


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_one_norm_over_several_optimizers_is_the_models_norm(norm_type):
    """Muon's matrices and AdamW's other params, or two model chunks: the total is as close to
    the exact (float64) norm of every grad as torch's get_total_norm is, or within two fp32 ulps
    (each optimizer's norm is within one, test_clip.py, and combining them rounds once more, as
    torch combines its per-tensor norms); every optimizer's last_grad_norm is it, and its next
    step clips by it."""
    gen = torch.Generator().manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    matrices = fused_amp.optim.Muon([p for p in params if p.ndim == 2], lr=1e-2)
    others = fused_amp.optim.AdamW([p for p in params if p.ndim != 2], lr=1e-2)
    total = fused_amp.optim.clip_grad_norm_([matrices, others], 1.0, norm_type)
    grads = [p.grad for p in params]
    exact = float(torch.linalg.vector_norm(torch.cat([g.double().flatten() for g in grads]), norm_type))
    torch_error = max(abs(float(torch.nn.utils.get_total_norm(grads, norm_type, foreach=f)) - exact)
                      for f in (True, False))
    assert abs(float(total) - exact) <= max(torch_error, 2 * torch.finfo(torch.float32).eps * exact)
    for o in (matrices, others):
        assert float(o.last_grad_norm) == float(total)
        assert o._clip.pending[1] == 1.0


def test_one_norm_by_inf_is_the_norm_alone():
    """torch's clip_grad_norm_(params, inf) returns the norm and multiplies the grads by 1
    (torchtitan's training.max_norm=inf): the steps are those of no clip, bit for bit."""
    gen = torch.Generator().manual_seed(2)
    runs = []
    for clip in (True, False):
        params = [torch.nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(3))) for s in SHAPES]
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen.manual_seed(4))
        pair = [fused_amp.optim.Muon([p for p in params if p.ndim == 2], lr=1e-2),
                fused_amp.optim.AdamW([p for p in params if p.ndim != 2], lr=1e-2)]
        if clip:
            total = fused_amp.optim.clip_grad_norm_(pair, math.inf)
            grads = [p.grad.double().flatten() for p in params]
            assert abs(float(total) - float(torch.cat(grads).norm())) <= 2 * torch.finfo(torch.float32).eps * float(total)
        for o in pair:
            o.step()
        runs.append(params)
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_one_norm_refuses_what_is_not_a_fused_amp_optimizer_and_changes_nothing():
    p = torch.nn.Parameter(torch.randn(4))
    p.grad = torch.randn(4)
    ours = fused_amp.optim.AdamW([p], lr=1e-2)
    with pytest.raises(TypeError, match=r"clip_grad_norm_: optimizers\[1\] is SGD, not a fused_amp optimizer"):
        fused_amp.optim.clip_grad_norm_([ours, torch.optim.SGD([p], lr=1e-2)], 1.0)
    with pytest.raises(ValueError, match="max_grad_norm"):
        fused_amp.optim.clip_grad_norm_([ours], -1.0)
    assert ours._clip.pending is None


# ---- FSDP2's CPUOffloadPolicy on gloo ranks ------------------------------------------------------

# the memory modes of the quick tier: (params' dtype, options)
OFFLOAD_MODES = {"fp32": (torch.float32, {}), "bf16 + fp32 master": (torch.bfloat16, {}),
                 "bf16 + remainder": (torch.bfloat16, dict(master_weights="remainder")),
                 "bf16 + 24-bit": (torch.bfloat16, dict(master_weights="remainder8")),
                 "bf16 + fp32 master, 8-bit state": (torch.bfloat16, dict(state_dtype=torch.uint8, min_8bit_size=0))}


def offload_run(rank, world):
    """Each memory mode, with and without CPUOffloadPolicy(pin_memory=False): 4 steps of AdamW
    with max_grad_norm under fused_amp.GradScaler, an overflow on one rank at step 2."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    out = {}
    for mode, (dtype, options) in OFFLOAD_MODES.items():
        for offload in (False, True):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(dtype)
            policy = dict(offload_policy=CPUOffloadPolicy(pin_memory=False)) if offload else {}
            for layer in (model[0], model[2], model):
                fully_shard(layer, **policy)
            params = list(model.parameters())
            group = model[0]._get_fsdp_state()._fsdp_param_group
            assert [fsdp_param.offload_to_cpu for fsdp_param in group.fsdp_params] == [offload] * 2
            opt = fused_amp.optim.AdamW(params, lr=1e-2, max_grad_norm=0.05, **options)
            scaler = fused_amp.GradScaler("cpu", init_scale=256.0)
            for step in range(4):
                opt.zero_grad()
                scaler.scale(model(batch(rank, step, 2).to(dtype)).float().pow(2).mean()).backward()
                scaler.step(opt)
                scaler.update()
            out[mode, offload] = dict(local=[p.to_local().clone() for p in params], scale=scaler.get_scale(),
                                      norm=float(opt.last_grad_norm),
                                      state=[{k: v.to_local().clone() if hasattr(v, "to_local") else v
                                              for k, v in opt.state[p].items()} for p in params])
    return out


def test_fsdp2_cpu_offload_steps_bitwise_as_without_it():
    """FSDP2's CPUOffloadPolicy(pin_memory=False) on 2 gloo ranks: in every memory mode, with
    clipping and an overflow step on one rank, the shards, the optimizer state, the norm and the
    scale are bitwise those of the same run without offload."""
    for rank_result in run_ranks(offload_run, 2):
        for mode in OFFLOAD_MODES:
            kept, offloaded = rank_result[mode, False], rank_result[mode, True]
            assert offloaded["scale"] == kept["scale"] == 128.0, mode  # the overflow skipped once
            assert offloaded["norm"] == kept["norm"], mode
            for a, b in zip(offloaded["local"], kept["local"]):
                assert_bitwise_equal(a, b, mode)
            for sa, sb in zip(offloaded["state"], kept["state"]):
                assert sa.keys() == sb.keys()
                for key in sa:
                    if isinstance(sa[key], torch.Tensor):
                        assert_bitwise_equal(sa[key], sb[key], f"{mode}: {key}")


# ---- on a GPU: the engines themselves --------------------------------------------------------

@pytest.mark.cuda
def test_torchao_cpu_offload_optimizer_steps_ours_as_one_optimizer_would():
    """torchao's CPUOffloadOptimizer with ``optimizer_class=fused_amp.optim.AdamW``: the params
    of 4,096+ elements step on the host, one optimizer each, the others on the GPU; every param
    is bitwise what one fused_amp AdamW on the CPU makes of the same grads (the CPU and CUDA
    kernels agree bit for bit: test_cuda.py)."""
    pytest.importorskip("torchao.optim")
    from torchao.optim import CPUOffloadOptimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 64)).cuda()
    reference = copy.deepcopy(model).cpu()
    engine = CPUOffloadOptimizer(model.parameters(), fused_amp.optim.AdamW, lr=1e-2, weight_decay=0.1)
    assert len(engine.optim_dict) == 2  # (the two weights; the biases stay on the GPU)
    one = fused_amp.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        model(torch.randn(8, 64, generator=gen).cuda()).pow(2).mean().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            q.grad = p.grad.detach().cpu().clone()
        engine.step()
        engine.zero_grad()
        one.step()
        one.zero_grad()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_bitwise_equal(p.detach().cpu(), q.detach())


def pinned_offload_run(rank, world):
    """FSDP2 on the GPU (an NCCL group of this one rank) with and without
    CPUOffloadPolicy(pin_memory=True): the optimizer steps pinned host shards, or the GPU's."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    mesh = DeviceMesh.from_group(dist.new_group(backend="nccl"), "cuda")
    out = {}
    for offload in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).cuda()
        policy = dict(offload_policy=CPUOffloadPolicy(pin_memory=True)) if offload else {}
        for layer in (model[0], model[2], model):
            fully_shard(layer, mesh=mesh, **policy)
        params = list(model.parameters())
        assert all(p.to_local().is_pinned() == offload for p in params)
        opt = fused_amp.optim.AdamW(params, lr=1e-2)
        for step in range(4):
            opt.zero_grad()
            model(batch(rank, step, None).float().cuda()).pow(2).mean().backward()
            opt.step()
        out[offload] = [p.to_local().cpu().clone() for p in params]
    return out


@pytest.mark.cuda
def test_fsdp2_pinned_cpu_offload_steps_on_the_host_as_on_the_gpu():
    """FSDP2's CPUOffloadPolicy(pin_memory=True): fused_amp's AdamW stepping the pinned host
    shards gives bitwise the shards it gives stepping on the GPU."""
    (result,) = run_ranks(pinned_offload_run, 1)
    for a, b in zip(result[True], result[False]):
        assert_bitwise_equal(a, b)
