"""Checks our peers run that we had not (issue 24, item 9), written for our ops:

* TransformerEngine's tests/pytorch/test_multi_tensor.py: pairs of sizes around the chunk
  boundary, the same tensors repeated in a list, an inf/NaN at every position, for unscale
  (bitwise torch's) and the norm (as close to the exact norm as torch's own);
* bitsandbytes' tests/test_optim.py: state dicts saved to disk mid-run and loaded into a fresh
  optimizer, which then steps bitwise as the original, for every optimizer and memory mode;
  many param groups, each stepping as its own optimizer would;
* FlashOptim's bf16 + correction masters: the split and join at the boundaries of every
  exponent's mantissa (ties, carries into the exponent, the overflow threshold, subnormals)."""
import inspect
import io
import math

import pytest
import torch

from fused_amp import ops
from fused_amp.optim._memory import join_master, join_master24, split_master, split_master24
from helpers import assert_bitwise_equal
from optim_registry import STATEFUL, STATEFUL_IDS

CHUNK = 1 << 16  # the CPU norm's chunk and the CUDA kernels' chunk
SIZE_PAIRS = [(777, 555), (555, CHUNK + 1), (CHUNK + 1, 555), (555, CHUNK), (CHUNK, 555),
              (33333, 555), (555, 33333), (CHUNK - 1, 2 * CHUNK + 1)]


def clones(tensors):
    """Copies of ``tensors``, the same tensor repeated in the list staying one tensor."""
    made = {}
    return [made.setdefault(id(t), t.clone()) for t in tensors]


def torch_unscale(tensors, inv_scale):
    copies = clones(tensors)
    found = torch.zeros(())
    torch._amp_foreach_non_finite_check_and_unscale_(copies, found, torch.tensor(inv_scale))
    return copies, found


def our_unscale(tensors, inv_scale):
    copies = clones(tensors)
    found = torch.zeros(())
    ops.unscale_(copies, found, torch.tensor(inv_scale))
    return copies, found


def our_norm(tensors, inv_scale=None):
    found, norm = torch.zeros(()), torch.empty(())
    ops.grad_norm_(tensors, found, norm, None if inv_scale is None else torch.tensor(inv_scale), 2.0)
    return norm, found


def assert_norm_as_close_as_torchs(norm, tensors, inv_scale=1.0):
    exact = torch.linalg.vector_norm(torch.cat([t.double().flatten() for t in tensors])) * inv_scale
    unscaled = [t.float() * inv_scale for t in tensors]
    torch_error = max(abs(torch.nn.utils.get_total_norm(unscaled, 2.0, foreach=f).double() - exact).item()
                      for f in (True, False))
    assert abs(norm.double() - exact).item() <= max(torch_error, torch.finfo(torch.float32).eps * exact.item())


# each pair once, and the smaller ones also repeated 55 times in one list (as TE repeats them)
PAIR_CASES = [(sizes, 1) for sizes in SIZE_PAIRS] + [(sizes, 55) for sizes in SIZE_PAIRS
                                                      if max(sizes) <= CHUNK + 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sizes,repeat", PAIR_CASES, ids=[f"{a}-{b}x{r}" for (a, b), r in PAIR_CASES])
def test_size_pairs_around_the_chunk_repeated_unscale_and_norm_as_torch(sizes, repeat, dtype):
    """A list of two tensors, and of the same two tensor objects repeated: the norm counts each
    occurrence, as torch's; unscale_ in place refuses a repeated tensor (torch's CPU loop unscales
    it once per occurrence, its CUDA kernel races on it: a grad unscaled twice is wrong either
    way, and our threads would race too), naming both positions, before writing anything."""
    gen = torch.Generator().manual_seed(sum(sizes))
    a, b = (torch.randn(n, generator=gen).mul(4.0).to(dtype) for n in sizes)
    inv = 0.5
    ours, theirs = our_unscale([a, b], inv), torch_unscale([a, b], inv)
    for x, y in zip(ours[0], theirs[0]):
        assert_bitwise_equal(x, y)
    assert ours[1].item() == theirs[1].item() == 0.0
    repeated = [a, b] * repeat
    norm, found = our_norm(repeated, inv)
    assert found.item() == 0.0
    assert_norm_as_close_as_torchs(norm, repeated, inv)
    if repeat > 1:
        before = [t.clone() for t in (a, b)]
        with pytest.raises(ValueError, match=r"tensors\[0\] and tensors\[2\] are the same memory"):
            ops.unscale_(repeated, torch.zeros(()), torch.tensor(inv))
        for t, u in zip((a, b), before):
            assert_bitwise_equal(t, u)


def test_a_param_repeated_or_a_grad_shared_is_refused_before_any_update():
    """torch warns of a param repeated in a group and updates it once per occurrence; two
    params sharing one grad tensor would have it unscaled twice. Both are refused by the step."""
    import fused_amp

    p, q = torch.nn.Parameter(torch.ones(3).bfloat16()), torch.nn.Parameter(torch.ones(3).bfloat16())
    with pytest.warns(UserWarning, match="duplicate parameters"):
        opt = fused_amp.optim.AdamW([p, q, p])
    p.grad, q.grad = torch.ones(3).bfloat16(), torch.ones(3).bfloat16()
    with pytest.raises(ValueError, match=r"params\[0\] and params\[2\] are the same memory"):
        opt.step()
    assert torch.equal(p.detach(), torch.ones(3).bfloat16()) and torch.equal(q.detach(), p.detach())
    assert opt.state[q]["step"].item() == 0.0  # created (as torch creates it), never stepped
    shared = torch.ones(3).bfloat16()
    p.grad = q.grad = shared
    opt = fused_amp.optim.AdamW([p, q])
    scaler = fused_amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale(torch.ones(()))
    with pytest.raises(ValueError, match="are the same memory"):
        scaler.step(opt)
    assert torch.equal(shared, torch.ones(3).bfloat16())


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_nonfinite_value_at_every_position_of_a_list_is_found(dtype, bad):
    """Tensors of 1 to 40 elements (vector bodies and tails), the bad value at each of their
    820 positions in turn: unscale flags it as torch does and changes the rest as torch does;
    the norm flags it and is inf (for an inf) or NaN (for a NaN), as torch's norm."""
    gen = torch.Generator().manual_seed(7)
    clean = [torch.randn(n, generator=gen).to(dtype) for n in range(1, 41)]
    flat_positions = [(i, j) for i, t in enumerate(clean) for j in range(t.numel())]
    assert len(flat_positions) == 820
    for i, j in flat_positions:
        tensors = [t.clone() for t in clean]
        tensors[i][j] = bad
        ours, theirs = our_unscale(tensors, 0.25), torch_unscale(tensors, 0.25)
        assert ours[1].item() == theirs[1].item() == 1.0, (i, j)
        for x, y in zip(ours[0], theirs[0]):
            assert_bitwise_equal(x, y, f"{i}, {j}")
        norm, found = our_norm(tensors)
        assert found.item() == 1.0, (i, j)
        expected = torch.nn.utils.get_total_norm([t.float() for t in tensors], 2.0)
        assert (norm.isnan().item(), norm.isinf().item()) == (expected.isnan().item(), expected.isinf().item()), (i, j)


# ---- bitsandbytes: state dicts mid-run, many groups ---------------------------------------

MODES = [dict(), dict(master_weights="remainder", state_dtype=torch.bfloat16, stochastic_rounding=True),
         dict(master_weights="remainder8", state_dtype=torch.uint8, min_8bit_size=0),
         dict(master_weights=False)]
MODE_IDS = ["fp32", "remainder+bf16-sr", "24-bit+8-bit", "no-masters"]
SHAPES = [(33, 17), (600,), (1,), (4, 4, 4)]


def make(cls, kw, mode, seed=0):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).bfloat16()) for s in SHAPES]
    groups = [{"params": params[:2]}, {"params": params[2:], "lr": kw["lr"] * 0.3}]
    return params, cls(groups, **kw, **mode)


def steps(params, opt, seeds):
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).bfloat16()
        opt.step()


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_a_state_dict_saved_to_disk_mid_run_resumes_bitwise(cls, torch_cls, kw, mode):
    params, opt = make(cls, kw, mode)
    steps(params, opt, range(3))
    buffer = io.BytesIO()
    torch.save({"params": [p.detach() for p in params], "optimizer": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    resumed_params, resumed = make(cls, kw, mode, seed=1)  # other weights: all must come from disk
    with torch.no_grad():
        for p, value in zip(resumed_params, saved["params"]):
            p.copy_(value)
    resumed.load_state_dict(saved["optimizer"])
    steps(params, opt, range(3, 8))
    steps(resumed_params, resumed, range(3, 8))
    for p, q in zip(params, resumed_params):
        assert_bitwise_equal(p.detach(), q.detach())
    a, b = opt.state_dict()["state"], resumed.state_dict()["state"]
    for i in a:
        for key, value in a[i].items():
            assert_bitwise_equal(value, b[i][key], f"state[{i}][{key!r}]")


@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_many_param_groups_each_step_as_their_own_optimizer(cls, torch_cls, kw):
    """16 groups with their own lr and weight decay (and in half of them the other memory mode):
    each param ends bitwise where an optimizer of its group alone leaves it."""
    gen = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(5 + i, generator=gen).bfloat16()) for i in range(16)]
    decays = "weight_decay" in inspect.signature(cls).parameters  # (Rprop has none)
    options = [dict(lr=kw["lr"] * (1 + i) / 8, master_weights="remainder" if i % 2 else True,
                    **(dict(weight_decay=0.01 * (i % 3)) if decays else {})) for i in range(16)]
    together = cls([dict(params=[p], **o) for p, o in zip(params, options)], **kw)
    alone_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    alone = [cls([p], **dict(kw, **o)) for p, o in zip(alone_params, options)]
    for seed in range(4):
        grads = [torch.randn(p.shape, generator=gen).bfloat16() for p in params]
        for p, q, g in zip(params, alone_params, grads):
            p.grad, q.grad = g.clone(), g.clone()
        together.step()
        for opt in alone:
            opt.step()
    for p, q in zip(params, alone_params):
        assert_bitwise_equal(p.detach(), q.detach())


# ---- FlashOptim: the bf16 + correction split at mantissa boundaries ------------------------

def boundary_masters():
    """For each exponent (subnormals and zero included) and sign: mantissas 0, 1, the ties of
    the 16-bit split (low half 0x8000 with an even and an odd high half), its neighbours, and
    all ones (the rounding carries into the exponent)."""
    mantissas = torch.tensor([0x000000, 0x000001, 0x007FFF, 0x008000, 0x008001, 0x018000,
                              0x00FFFF, 0x010000, 0x7F7FFF, 0x7F8000, 0x7FFFFF], dtype=torch.int64)
    exponents = torch.arange(0, 255, dtype=torch.int64) << 23
    patterns = (exponents[:, None] | mantissas[None, :]).flatten()
    patterns = torch.cat([patterns, patterns | (1 << 31)])
    return patterns.to(torch.uint32).view(torch.int32).view(torch.float32) if hasattr(torch, "uint32") \
        else torch.where(patterns >= 2 ** 31, patterns - 2 ** 32, patterns).to(torch.int32).view(torch.float32)


def test_the_remainder_split_is_exact_and_within_half_an_ulp_at_every_boundary():
    masters = boundary_masters()
    param, remainder = split_master(masters)
    assert_bitwise_equal(join_master(param, remainder), masters)
    high = param.float()
    overflow = (masters.abs() >= 3.3961776e38)  # rounds past bf16's largest finite value
    finite = ~overflow
    assert high[finite].isfinite().all() and high[overflow].isinf().all()
    magnitude = param[finite].abs()
    above = (magnitude.view(torch.int16) + 1).view(torch.bfloat16)  # the next bf16 up
    half_ulp = (above.double() - magnitude.double()) / 2
    gap = (high[finite].double() - masters[finite].double()).abs()
    # within half a bf16 ulp of the master (the ulp above the param: at a power of two the one
    # below is half as large, and a master rounded up to it lies within half of that)
    assert (gap <= half_ulp).all()
    # nearest, ties away from zero: differs from torch's (ties to even) only at ties
    ties = (masters.view(torch.int32) & 0xFFFF) == 0x8000
    torch_even = masters.bfloat16()
    assert torch.equal(param[~ties & finite], torch_even[~ties & finite])
    assert (high[ties & finite].abs() > masters[ties & finite].abs()).all()


def test_the_24_bit_split_is_exact_at_every_boundary():
    masters24 = (boundary_masters().view(torch.int32) & ~0xFF).view(torch.float32)  # 24-bit values
    param, remainder8 = split_master24(masters24)
    assert remainder8.dtype == torch.uint8
    assert_bitwise_equal(join_master24(param, remainder8), masters24)
    finite = masters24.abs() < 3.3961776e38
    assert param.float()[finite].isfinite().all()
