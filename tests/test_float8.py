"""fp8 training with torchao's float8 linears (tensorwise dynamic scaling) and our optimizers, on
CPU (torch._scaled_mm runs there): FSDP2's fp8 all-gather on 2 gloo ranks with the scales the
fused step hands over, bitwise as torchao's own precompute_float8_dynamic_scale_for_fsdp."""
import math

import pytest
import torch

import fused_amp
from fused_amp.benchmark import harness
from optim_registry import PLAIN, PLAIN_IDS

torchao_float8 = pytest.importorskip("torchao.float8")


def run_ranks(fn, world, *args):
    try:
        return harness.run_ranks(fn, world, *args, deadline_s=180)
    except RuntimeError as e:
        pytest.fail(str(e))


def float8_model(seed=0):
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 48),
                                torch.nn.GELU(), torch.nn.Linear(48, 16)).to(torch.bfloat16)
    convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def float8_weights(model):
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    return [p._local_tensor for p in model.parameters()
            if isinstance(p._local_tensor, WeightWithDynamicFloat8CastTensor)]


def scales(model):
    return [w._precomputed_scale.clone() for w in float8_weights(model)]


def fp8_run(rank, world, cls, kw, options, steps=4, overflow_at=2):
    """Trains the fp8 model with ``cls``; after each step records the scales the step handed over
    and those torchao's precompute computes from the same weights, and trains on with ours; with
    ``float8_scales=False`` it records and trains with torchao's (its recipe as its docs give it)."""
    from torchao.float8.fsdp_utils import precompute_float8_dynamic_scale_for_fsdp

    model = float8_model()
    opt = cls(model.parameters(), **kw, **options)
    scaler = fused_amp.GradScaler("cpu", init_scale=2.0 ** 8)
    ours, theirs, losses = [], [], []
    for step in range(steps):
        torch.manual_seed(100 + 2 * step + rank)
        x = torch.randn(16, 32, dtype=torch.bfloat16)
        loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        if step == overflow_at and rank == 1:  # an overflow on one rank: every rank skips the step
            next(model.parameters()).grad._local_tensor.view(-1)[0] = math.inf
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        handed = [w._precomputed_scale for w in float8_weights(model)]
        precompute_float8_dynamic_scale_for_fsdp(model)
        theirs.append(scales(model))
        if options.get("float8_scales") is not False:  # ours go on: the next steps all-gather with them
            ours.append([h.clone() for h in handed])
            for w, h in zip(float8_weights(model), handed):
                w._precomputed_scale = h
        losses.append(loss.item())
    return dict(ours=ours, theirs=theirs, losses=losses, scale=scaler.get_scale(),
                params=[p.full_tensor() for p in model.parameters()])


@pytest.mark.parametrize("options", [dict(), dict(master_weights="remainder"),
                                     dict(master_weights="remainder8", state_dtype=torch.uint8, min_8bit_size=0)],
                         ids=["fp32 masters", "remainder", "24-bit + 8-bit state"])
def test_fsdp2_float8_scales_from_the_step_are_torchaos(options):
    """Every step (an overflow step, which writes no weight, among them) hands over bitwise the
    scales torchao's precompute computes from the same sharded weights, and training with them
    is bitwise training with torchao's precompute."""
    cls, kw = fused_amp.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)
    ours = run_ranks(fp8_run, 2, cls, kw, options)
    recipe = run_ranks(fp8_run, 2, cls, kw, dict(options, float8_scales=False))
    for rank, (o, r) in enumerate(zip(ours, recipe)):
        assert o["scale"] == r["scale"] == 2.0 ** 7  # the overflow step was skipped on both
        assert len(o["ours"][0]) == 3  # the three linears' weights
        for step, (handed, precomputed) in enumerate(zip(o["ours"], o["theirs"])):
            for a, b in zip(handed, precomputed):
                assert torch.equal(a, b), f"rank {rank} step {step}: {a} != {b}"
        assert o["losses"] == r["losses"]
        for a, b in zip(o["params"], r["params"]):
            assert torch.equal(a, b)


def in_backward_run(rank, world, steps=3):
    """fp8_run's model stepping in backward, a param at a time (bucket_bytes=0): after each
    backward the scales handed over, torchao's precompute of the same weights, and how many
    hand-overs (each one all-reduce) the backward made."""
    from torchao.float8.fsdp_utils import precompute_float8_dynamic_scale_for_fsdp
    from fused_amp.optim import _float8

    model = float8_model()
    opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    handle = fused_amp.optim.step_in_backward(opt, bucket_bytes=0)
    hand_overs, original = [], _float8.hand_over
    _float8.hand_over = lambda all_lists: (hand_overs.append(len(all_lists)), original(all_lists))
    try:
        ours, theirs, counts = [], [], []
        for step in range(steps):
            torch.manual_seed(100 + 2 * step + rank)
            model(torch.randn(16, 32, dtype=torch.bfloat16)).float().pow(2).mean().backward()  # the params step
            counts.append(list(hand_overs))
            hand_overs.clear()
            ours.append(scales(model))
            precompute_float8_dynamic_scale_for_fsdp(model)
            theirs.append(scales(model))
    finally:
        _float8.hand_over = original
        handle.remove()
    return dict(ours=ours, theirs=theirs, counts=counts)


def test_fsdp2_float8_scales_from_steps_in_backward_are_torchaos_in_one_hand_over():
    """step_in_backward steps each weight alone; the scales of all of them are handed over once
    when backward ends (one all-reduce, as torchao's precompute makes), bitwise torchao's."""
    for rank, o in enumerate(run_ranks(in_backward_run, 2)):
        for step, (handed, precomputed, count) in enumerate(zip(o["ours"], o["theirs"], o["counts"])):
            assert count == [3], f"rank {rank} step {step}: hand-overs of {count} buckets' lists"
            assert len(handed) == 3 and all(map(torch.equal, handed, precomputed)), f"rank {rank} step {step}"


def every_optimizer_run(rank, world):
    """fp8_run of each optimizer of the registry (its plain options), in one launch of the ranks."""
    return {name: fp8_run(rank, world, cls, kw, dict(float8_scales=True), 3, None)
            for name, (cls, _, kw) in zip(PLAIN_IDS, PLAIN)}


def test_every_optimizer_hands_over_torchaos_scales():
    for rank, results in enumerate(run_ranks(every_optimizer_run, 2)):
        assert sorted(results) == sorted(PLAIN_IDS)
        for name, o in results.items():
            assert len(o["ours"]) == 3
            for step, (handed, precomputed) in enumerate(zip(o["ours"], o["theirs"])):
                assert all(torch.equal(a, b) for a, b in zip(handed, precomputed)), f"{name}, rank {rank}, step {step}"


def test_float8_scales_true_without_float8_weights_is_refused():
    p = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = fused_amp.optim.AdamW([p], float8_scales=True)
    p.grad = torch.ones_like(p)
    before = p.detach().clone()
    with pytest.raises(ValueError, match="float8_scales=True, but no param"):
        opt.step()
    assert torch.equal(p.detach(), before)


def test_float8_scales_takes_a_bool_or_none():
    with pytest.raises(ValueError, match="float8_scales must be True, False or None"):
        fused_amp.optim.AdamW([torch.nn.Parameter(torch.ones(2))], float8_scales="yes")


def test_the_amaxes_reduce_over_every_sharded_mesh_dim_and_no_other():
    """TP + FSDP2 gives a weight _StridedShard on the FSDP dim (its is_shard() says False): the
    amaxes reduce over it too; HSDP's replicate dim is left alone; a Partial weight raises."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    from fused_amp.optim._float8 import amax_placements

    assert amax_placements([_StridedShard(0, split_factor=2), Shard(1)]) == [Partial("max"), Partial("max")]
    assert amax_placements([Replicate(), Shard(0)]) == [Replicate(), Partial("max")]
    with pytest.raises(NotImplementedError, match="a float8 weight has the placement"):
        amax_placements([Shard(0), Partial()])
