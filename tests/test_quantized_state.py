"""8-bit blockwise optimizer state (state_dtype=torch.uint8), and where it is the same 4-bit
state (torch.uint4: tests/test_state4.py has its own), generic over every optimizer and
option set of the registry: the step is the fp32-state step from the dequantized state, bit for
bit, and stores the codes of the map written in fused_amp/optim/_quantize.py (itself checked
against the closed forms of csrc/ops/quantize.h on every code); no code pairing lets a weight
jump; overflow steps change nothing; checkpoints hold fp32 moments; bad input is refused."""
import copy
import io
import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fused_amp
from fused_amp import ops
from fused_amp.optim import Adam, AdamW
from fused_amp.optim._quantize import ABSMAX, QUANT_BLOCK, _sqrt, block_of, constant_code, dequantize, quantize
from helpers import assert_bitwise_equal, rounding_bits, rounding_key, adam_step_
from optim_registry import CASES, IDS, PARAM_DTYPES

# sizes around the block: a tail alone, one block, blocks and a tail, a 3-d param
SHAPES = [(7,), (QUANT_BLOCK,), (64, 33), (3, 5, 9), (1000,)]
# each state's 8-bit map, as the optimizers' descriptors declare it (csrc/ops/<name>.h)
SIGNED = {key: signed for entry in ops.optimizers().values() for key, _, signed in entry["states"]}


def make_params(dtype, shapes=SHAPES, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in shapes]


def set_grads(params, step, scale=1.0):
    gen = torch.Generator().manual_seed(1000 + step)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * scale).to(p.dtype)


def step_alike(optimizers, param_lists):
    """Steps each optimizer on the same grads; every param list ends bitwise equal to the first."""
    for ps in param_lists:
        set_grads(ps, 3)
    for o in optimizers:
        o.step()
    for ps in param_lists[1:]:
        for p, q in zip(param_lists[0], ps):
            assert_bitwise_equal(q.detach(), p.detach())


def state_keys(opt, p):
    return [k for k in opt.state[p] if k in SIGNED]


def fp32_twin(cls, kw, opt, params, master_weights, stochastic_rounding=None):
    """An fp32-state optimizer over copies of ``params`` whose state is ``opt``'s, dequantized."""
    twin_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    twin = cls(twin_params, master_weights=master_weights, stochastic_rounding=stochastic_rounding, **kw)
    for p, q in zip(params, twin_params):
        state = opt.state[p]
        twin.state[q] = {k: v.clone() for k, v in state.items() if k not in SIGNED and k != ABSMAX}
        for row, key in enumerate(state_keys(opt, p)):
            twin.state[q][key] = dequantize(state[key], state[ABSMAX][row], SIGNED[key], p.detach())
    return twin, twin_params


def master_modes(dtype):
    return [True, False] + (["remainder", "remainder8"] if dtype == torch.bfloat16 else [])


def stochastic_codes(values: torch.Tensor, absmax: torch.Tensor, signed: bool, key: int) -> torch.Tensor:
    """The codes of a contiguous state's fp32 values rounded stochastically, written again from
    the rule (csrc/ops/quantize.h): from c = floor(sqrt(t)), t = levels^2 |x| / absmax, to c + 1
    when 2^15 (t - c^2) exceeds r (2c + 1), r the element's 15
    random bits (the low half of its 32 for signed states, the high half for unsigned ones)."""
    x = values.reshape(-1)
    n = x.numel()
    a = absmax.repeat_interleave(QUANT_BLOCK)[:n]
    coded = a > 0  # the absmax stored: 0 for a block too small to code, NaN for one that is not finite
    levels = 127.0 if signed else 255.0
    unit = torch.minimum((x.abs() if signed else x) * (1.0 / torch.where(coded, a, torch.ones_like(a))),
                         torch.ones_like(x))
    t = unit * levels ** 2
    c = torch.floor(_sqrt(t))  # c^2 may exceed t by a rounding: then t - c^2 < 0 and x stays at c
    bits = rounding_bits(key, n)
    r = ((bits & 0xffff) if signed else (bits >> 16)) >> 1
    up = (t - c * c).double() * 32768 > r.double() * (2 * c.double() + 1)
    magnitude = c + up.float()
    code = torch.copysign(magnitude, x) if signed else torch.maximum(magnitude, (x > 0).float())
    code = torch.where(coded, code, torch.zeros_like(code))
    return code.to(torch.int32).to(torch.uint8).reshape(values.shape)


@pytest.mark.parametrize("state_dtype", [torch.uint8, torch.uint4], ids=str)
@pytest.mark.parametrize("dtype", PARAM_DTYPES, ids=str)
@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_a_step_is_the_fp32_state_step_from_the_dequantized_state(cls, torch_cls, kw, dtype, state_dtype):
    """After a few steps, one more step with 8- or 4-bit state gives bitwise the params and
    masters that the fp32-state step gives from the dequantized state, and stores bitwise the
    codes and absmax that the Python quantizer makes of that step's fp32 state (to nearest), or
    with stochastic_rounding=True the 8-bit codes of the stochastic rule written again above
    (4-bit codes always round to nearest)."""
    roundings = (False, True) if state_dtype == torch.uint8 else (False,)
    for master_weights, stochastic in [(m, s) for m in master_modes(dtype) for s in roundings]:
        params = make_params(dtype)
        # to nearest: the default, but for a running sum's state, which rounds stochastically by
        # default (then the masters round to nearest too, in both)
        nearest = False if cls._running_sums else None
        opt = cls(params, state_dtype=state_dtype, min_8bit_size=0, master_weights=master_weights,
                  stochastic_rounding=True if stochastic else nearest, **kw)
        for step in range(3):
            set_grads(params, step)
            opt.step()
        twin, twin_params = fp32_twin(cls, kw, opt, params, master_weights, None if stochastic else nearest)
        set_grads(params, 3)
        set_grads(twin_params, 3)
        opt.step()
        twin.step()
        for i, (p, q) in enumerate(zip(params, twin_params)):
            where = f"{master_weights} {'stochastic' if stochastic else 'nearest'} param {i}"
            # (the twin starts from this state: a state the step read wrongly all along, NaN
            # included, would pass the bitwise check alone)
            assert torch.isfinite(p).all(), f"{where}: finite grads made a non-finite param"
            assert_bitwise_equal(p.detach(), q.detach(), where)
            for key in ("master_param", "master_remainder", "master_remainder8"):
                if key in twin.state[q]:
                    assert_bitwise_equal(opt.state[p][key], twin.state[q][key], f"{where} {key}")
            keys = state_keys(opt, p)
            if not keys:  # SGD without momentum keeps no state
                assert ABSMAX not in opt.state[p]
                continue
            assert opt.state[p][ABSMAX].shape == (len(keys), -(-p.numel() // block_of(state_dtype)))
            for row, key in enumerate(keys):
                if state_dtype == torch.uint4:  # two codes per byte
                    assert opt.state[p][key].shape == ((p.numel() + 1) // 2,)
                codes, absmax = quantize(twin.state[q][key], p, SIGNED[key], state_dtype)
                if stochastic:
                    step_key = rounding_key(opt.param_groups[0]["rounding_seed"], int(opt.state[p]["step"]))
                    codes = stochastic_codes(twin.state[q][key], absmax, SIGNED[key], step_key)
                assert_bitwise_equal(opt.state[p][key], codes, f"{where} {key} codes")
                assert_bitwise_equal(opt.state[p][ABSMAX][row], absmax, f"{where} {key} absmax")


def closed_form(codes: torch.Tensor, absmax: float, signed: bool) -> torch.Tensor:
    """The maps of csrc/ops/quantize.h, in float64 from the codes."""
    c = codes.view(torch.int8).double() if signed else codes.double()
    return (torch.sign(c) * (c / 127) ** 2 if signed else (c / 255) ** 2) * absmax


@pytest.mark.parametrize("signed", [True, False])
def test_every_code_dequantizes_to_its_closed_form_and_quantizes_back(signed):
    """Every one of the 256 codes: its value is the closed form within an fp32 rounding, and
    quantizing that value gives the code back (the map is its own inverse on its points)."""
    absmax = 3.0
    all_codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    if signed:
        all_codes = all_codes[all_codes.view(torch.int8) != -128]  # -128 is never written
    n = all_codes.numel()
    codes = torch.cat([all_codes, torch.full((QUANT_BLOCK - n,), 127 if signed else 255, dtype=torch.uint8)])
    values = dequantize(codes, torch.tensor([absmax]), signed)
    expected = closed_form(codes, absmax, signed)
    torch.testing.assert_close(values.double(), expected, rtol=3e-7, atol=0)
    back, back_absmax = quantize(values, codes, signed)
    assert_bitwise_equal(back, codes)
    assert back_absmax.item() == pytest.approx(absmax, rel=2e-7)


@pytest.mark.parametrize("signed", [True, False])
def test_a_constant_state_codes_as_quantize_codes_it(signed):
    """constant_code (new state at its initial value, without tensors for torch.compile) is
    quantize of the filled tensor: every code and every block's absmax, a partial block too."""
    values = [0.0, 0.1, 1e-2, 3.0, 1e-39, math.inf] + ([-0.5, -1e-3] if signed else [])
    for value in values:
        codes, absmax = quantize(torch.full((2 * QUANT_BLOCK + 5,), value), torch.empty(2 * QUANT_BLOCK + 5), signed)
        code, a = constant_code(value, signed)
        assert_bitwise_equal(codes, torch.full_like(codes, code))
        assert_bitwise_equal(absmax, torch.full_like(absmax, a))


def test_a_positive_second_moment_never_codes_to_zero():
    x = torch.tensor([1.0] + [1e-30, 1e-40, 1e-45, 0.0] * 10)
    codes, _ = quantize(x, x, signed=False)
    assert (codes[1:][x[1:] > 0] >= 1).all() and (codes[1:][x[1:] == 0] == 0).all()


def test_nonfinite_state_reads_back_as_nan_and_tiny_blocks_as_zero():
    x = torch.ones(2 * QUANT_BLOCK)
    x[3] = math.nan
    x[QUANT_BLOCK:] = 1e-39  # below FLT_MIN: stored as zeros
    for signed in (True, False):
        codes, absmax = quantize(x, x, signed)
        back = dequantize(codes, absmax, signed)
        assert back[:QUANT_BLOCK].isnan().all()
        assert (back[QUANT_BLOCK:] == 0).all() and absmax[1] == 0


def test_stochastic_codes_are_unbiased_where_nearest_codes_are_not():
    """Adam's first moments (signed map) and second moments (unsigned), coded stochastically
    with 400 seeds: their mean dequantized value is the fp32 moment within 5 standard errors
    (a code's rounding error is at most one step between neighbouring codes, its standard
    deviation at most half a step: 5 / 40 of a step over 400 seeds). Nearest codes miss some
    elements by a quarter of a step or more, so the test tells the two apart. A positive second
    moment below the first code keeps code 1 (the map's floor against a v read as 0): left out."""
    n = 2 * QUANT_BLOCK + 37  # the vector loops, and a tail of scalars
    g = torch.rand(n, generator=torch.Generator().manual_seed(5)) * 2 - 1
    g[::QUANT_BLOCK] = 1.0  # every block's absmax from an element of |g| = 1

    def moments(state_dtype, stochastic=None, seed=None):
        p = torch.nn.Parameter(torch.zeros(n))
        opt = Adam([p], lr=0.0, state_dtype=state_dtype, min_8bit_size=0, stochastic_rounding=stochastic,
                   rounding_seed=seed)
        p.grad = g.clone()
        opt.step()
        s = opt.state[p]
        if state_dtype == torch.float32:
            return s["exp_avg"].double(), s["exp_avg_sq"].double()
        return (dequantize(s["exp_avg"], s[ABSMAX][0], True).double(),
                dequantize(s["exp_avg_sq"], s[ABSMAX][1], False).double())

    exact = moments(torch.float32)
    runs = [moments(torch.uint8, True, seed) for seed in range(400)]
    nearest = moments(torch.uint8, False)
    for k, (levels, signed) in enumerate([(127, True), (255, False)]):
        x = exact[k]
        absmax = x.abs().reshape(-1)[::QUANT_BLOCK].repeat_interleave(QUANT_BLOCK)[:n]
        c = torch.floor(levels * (x.abs() / absmax).sqrt())
        step = absmax * (2 * c + 1) / levels ** 2  # between the codes c and c + 1 around x
        keep = torch.ones_like(x, dtype=torch.bool) if signed else c >= 1
        mean = torch.stack([r[k] for r in runs]).mean(0)
        assert ((mean - x).abs() / step)[keep].max() <= 5 / 40, k
        assert ((nearest[k] - x).abs() / step)[keep].max() >= 0.25, k


def adam_displacement(state_dtype, grads, lr=1e-3):
    p = torch.nn.Parameter(torch.zeros(grads.shape[1]))
    opt = Adam([p], lr=lr, state_dtype=state_dtype, min_8bit_size=0)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach().abs()


@settings(max_examples=int(os.environ.get("FUSED_AMP_HYPOTHESIS_EXAMPLES", 60)), deadline=None)
@given(huge=st.floats(1e2, 1e15), tiny=st.floats(1e-30, 1e-3), steps=st.integers(1, 12),
       alternate=st.booleans(), seed=st.integers(0, 2**16))
def test_no_block_lets_a_weight_jump(huge, tiny, steps, alternate, seed):
    """Adversarial blocks: one huge element (its grad alternating in sign or not, so its first
    moment may be near 0 while its second is huge) beside tiny ones with steady grads. Adam's
    displacement per element with 8-bit state stays within a small factor of fp32 state's
    (both are at most about lr per step); a v that dequantized to 0 would give lr * m / eps.
    (A huge grad stays below 1e15, so that g^2 is finite in fp32: a moment that overflows makes
    its block read back as NaN, test_nonfinite_state_reads_back_as_nan_and_tiny_blocks_as_zero.)"""
    gen = torch.Generator().manual_seed(seed)
    n = QUANT_BLOCK
    grads = torch.rand(steps, n, generator=gen) * tiny + tiny / 2
    grads[:, 0] = huge
    if alternate:
        grads[1::2, 0] = -huge
    lr = 1e-3
    q8 = adam_displacement(torch.uint8, grads, lr)
    fp32 = adam_displacement(torch.float32, grads, lr)
    assert q8.max() <= 5 * lr * steps, (q8.max(), fp32.max())
    assert (q8 <= 40 * fp32 + 1e-12).all()


@pytest.mark.parametrize("state_dtype", [torch.uint8, torch.uint4], ids=str)
@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_an_overflow_step_changes_nothing_codes_and_absmax_included(cls, torch_cls, kw, state_dtype):
    """8- and 4-bit codes alike."""
    params = make_params(torch.bfloat16)
    opt = cls(params, state_dtype=state_dtype, min_8bit_size=0, **kw)
    scaler = fused_amp.GradScaler("cpu", init_scale=256.0)
    for step in range(4):
        scaler.scale(torch.ones(()))
        set_grads(params, step, 256.0)
        if step == 3:
            before = copy.deepcopy((opt.state, [p.detach().clone() for p in params]))
            params[2].grad[1, 3] = math.inf
        scaler.step(opt)
        scaler.update()
    state, values = before
    for p, v in zip(params, values):
        assert_bitwise_equal(p.detach(), v)
        for key, t in state[p].items():
            assert_bitwise_equal(opt.state[p][key], t, key)


@pytest.mark.parametrize("state_dtype", [torch.uint8, torch.uint4], ids=str)
def test_the_bits_do_not_depend_on_the_thread_count(state_dtype):
    """Blocks are fixed by the element index: 1 and 2 threads (whose ranges split inside a
    tensor) store the same codes, absmax and params, 8- and 4-bit alike."""
    shapes = [(70_001,), (3, 40_000)]
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            params = make_params(torch.bfloat16, shapes)
            opt = AdamW(params, state_dtype=state_dtype)
            for step in range(3):
                set_grads(params, step)
                opt.step()
            results.append([p.detach().clone() for p in params] + [t.clone() for p in params
                                                                    for t in opt.state[p].values()])
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert_bitwise_equal(a, b)


# (state_dtype, master_weights, bytes per param held, elements per absmax): remainder 2 + m 1 +
# v 1, plus 2 fp32 absmax per 256 elements; a 24-bit master's byte 1 + m 0.5 + v 0.5, plus 2 per 128
@pytest.mark.parametrize("state_dtype,master_weights,per_param,block", [
    (torch.uint8, "remainder", 4, QUANT_BLOCK), (torch.uint4, "remainder8", 2, 128)], ids=["8-bit", "4-bit"])
def test_small_params_keep_fp32_state_and_memory_is_what_is_said(state_dtype, master_weights, per_param, block):
    big, small = torch.nn.Parameter(torch.zeros(8192).bfloat16()), torch.nn.Parameter(torch.zeros(100).bfloat16())
    opt = AdamW([big, small], state_dtype=state_dtype, master_weights=master_weights)
    big.grad, small.grad = torch.ones_like(big), torch.ones_like(small)
    opt.step()
    assert opt.state[small]["exp_avg"].dtype == torch.float32 and ABSMAX not in opt.state[small]
    held = sum(t.numel() * t.element_size() for k, t in opt.state[big].items() if k != "step")
    assert held == 8192 * per_param + 2 * 4 * 8192 // block


@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_checkpoints_hold_fp32_moments_and_load_across_modes(cls, torch_cls, kw):
    """state_dict() holds the dequantized moments in fp32 (no codes): it loads into an
    fp32-state optimizer, which then steps exactly as the 8-bit one would have from the same
    (dequantized) state, and back into an 8-bit one, which requantizes the same codes."""
    params = make_params(torch.bfloat16)
    opt = cls(params, state_dtype=torch.uint8, min_8bit_size=0, **kw)
    for step in range(3):
        set_grads(params, step)
        opt.step()
    saved = opt.state_dict()
    for s in saved["state"].values():
        assert ABSMAX not in s and all(v.dtype == torch.float32 for v in s.values())
    again_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    again = cls(again_params, state_dtype=torch.uint8, min_8bit_size=0, **kw)
    again.load_state_dict(saved)
    for p, q in zip(params, again_params):
        for key, value in opt.state[p].items():
            assert_bitwise_equal(again.state[q][key], value, key)
    fp32_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fp32 = cls(fp32_params, **kw)
    fp32.load_state_dict(saved)
    step_alike((opt, fp32, again), (params, fp32_params, again_params))


def test_torch_checkpoints_load_into_8bit_state():
    params = make_params(torch.float32)
    theirs = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone()) for p in params], lr=1e-3)
    for p in theirs.param_groups[0]["params"]:
        p.grad = torch.randn_like(p)
    theirs.step()
    ours = AdamW(params, lr=1e-3, state_dtype=torch.uint8, min_8bit_size=0)
    ours.load_state_dict(theirs.state_dict())
    for p, q in zip(params, theirs.param_groups[0]["params"]):
        assert ours.state[p]["exp_avg"].dtype == torch.uint8
        torch.testing.assert_close(dequantize(ours.state[p]["exp_avg"], ours.state[p][ABSMAX][0], True),
                                   theirs.state[q]["exp_avg"], rtol=0.02, atol=theirs.state[q]["exp_avg"].abs().max().item() / 1000)


def checkpoint_bytes(state_dict) -> int:
    buf = io.BytesIO()
    torch.save(state_dict, buf)
    return buf.tell()


@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_a_compact_checkpoint_holds_the_codes_and_resumes_bit_for_bit(cls, torch_cls, kw):
    """state_dict(compact=True) keeps the codes and absmax as held; loaded into the same mode it
    gives back the state bit for bit (and the next step), into fp32 state the dequantized moments;
    it is smaller than the fp32 form by about the moments' 4 bytes less 1 per element."""
    params = make_params(torch.bfloat16, [(64, 33), (1000,)])
    opt = cls(params, state_dtype=torch.uint8, min_8bit_size=0, master_weights="remainder", **kw)
    for step in range(3):
        set_grads(params, step)
        opt.step()
    compact, full = opt.state_dict(compact=True), opt.state_dict()
    if not state_keys(opt, params[0]):  # SGD without momentum keeps no moments
        return
    for i, p in enumerate(params):
        assert compact["state"][i][ABSMAX] is opt.state[p][ABSMAX]
        assert all(compact["state"][i][k].dtype == torch.uint8 for k in state_keys(opt, p))
    moments = sum(p.numel() for p in params) * len(state_keys(opt, params[0]))
    assert checkpoint_bytes(full) - checkpoint_bytes(compact) >= 0.9 * 3 * moments
    buf = io.BytesIO()
    torch.save(compact, buf)
    buf.seek(0)
    compact = torch.load(buf)  # as a file gives it back
    again_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    again = cls(again_params, state_dtype=torch.uint8, min_8bit_size=0, master_weights="remainder", **kw)
    again.load_state_dict(compact)
    for p, q in zip(params, again_params):  # (the master stays fp32 until the next step splits it)
        for key in state_keys(opt, p) + [ABSMAX, "step"]:
            assert_bitwise_equal(again.state[q][key], opt.state[p][key], key)
    fp32_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fp32 = cls(fp32_params, master_weights="remainder", **kw)
    fp32.load_state_dict(compact)
    for p, q in zip(params, fp32_params):
        for row, key in enumerate(state_keys(opt, p)):
            assert_bitwise_equal(fp32.state[q][key], dequantize(opt.state[p][key], opt.state[p][ABSMAX][row],
                                                                 SIGNED[key]), key)
    step_alike((opt, again, fp32), (params, again_params, fp32_params))
    for p, q in zip(params, again_params):
        assert opt.state[p].keys() == again.state[q].keys()
        for key, value in opt.state[p].items():
            assert_bitwise_equal(again.state[q][key], value, key)


def test_a_bad_compact_checkpoint_is_refused_before_anything_changes():
    params = make_params(torch.float32, [(300,), (7,)])
    opt = AdamW(params, lr=1e-3, state_dtype=torch.uint8, min_8bit_size=0)
    set_grads(params, 0)
    opt.step()
    good = opt.state_dict(compact=True)
    before = [{k: v.clone() for k, v in opt.state[p].items()} for p in params]

    def with_entry(**changes):
        sd = copy.deepcopy(good)
        sd["state"][0].update(changes)
        return sd

    absmax = good["state"][0][ABSMAX]
    bad = [(with_entry(state_absmax=-absmax - 1), ValueError, "inf, NaN or negative"),
           (with_entry(state_absmax=absmax.clone().fill_(math.nan)), ValueError, "inf, NaN or negative"),
           (with_entry(state_absmax=absmax[:, :1].clone()), ValueError, "has shape \\(2, 1\\), expected \\(2, 2\\)"),
           (with_entry(state_absmax=absmax.double()), TypeError, "dtype torch.float64"),
           (with_entry(state_absmax=absmax.tolist()), TypeError, "not a tensor"),
           (with_entry(exp_avg=good["state"][0]["exp_avg"][:299].clone()), ValueError, "has shape \\(299,\\)"),
           (with_entry(exp_avg=good["state"][0]["exp_avg"].view(torch.int8).clone()), TypeError, "torch.int8"),
           (with_entry(exp_avg=torch.zeros(600, dtype=torch.uint8)[::2]), ValueError, "must be dense"),
           (with_entry(exp_avg=good["state"][0]["exp_avg"].float(), exp_avg_sq=good["state"][0]["exp_avg_sq"].float()),
            TypeError, "the moments are 8- or 4-bit codes")]
    for sd, error, match in bad:
        with pytest.raises(error, match=match):
            opt.load_state_dict(sd)
        for p, b in zip(params, before):
            for key, value in b.items():
                assert_bitwise_equal(opt.state[p][key], value, key)


def test_bad_input_is_refused_naming_the_argument():
    p = torch.nn.Parameter(torch.zeros(300).bfloat16())
    with pytest.raises(ValueError, match="min_8bit_size"):
        Adam([p], state_dtype=torch.uint8, min_8bit_size=-1)
    with pytest.raises(ValueError, match="CPU and CUDA kernels only"):
        Adam([torch.nn.Parameter(torch.zeros(5000, device="meta"))], state_dtype=torch.uint8)
    with pytest.raises(ValueError, match="float32, float16 and bfloat16"):
        Adam([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))], state_dtype=torch.uint8)
    opt = Adam([p], state_dtype=torch.uint8, min_8bit_size=0)
    p.grad = torch.ones_like(p)
    opt.step()
    state = opt.state[p]
    before = {k: v.clone() for k, v in state.items()}
    for bad, match in [(state[ABSMAX][:, :1].contiguous(), "state_absmaxes\\[0\\] has shape"),
                       (state[ABSMAX].double(), "state_absmaxes\\[0\\] has dtype"),
                       (state[ABSMAX].t().contiguous().t(), "must be contiguous")]:
        with pytest.raises(ValueError if "dtype" not in match else TypeError, match=match):
            adam_step_([p], [p.grad], [state["master_param"]], [state["exp_avg"]],
                                     [state["exp_avg_sq"]], [], [state["step"]], state_absmaxes=[bad],
                                     lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                                     amsgrad=False, maximize=False, decoupled_weight_decay=False)
    with pytest.raises(ValueError, match="stochastic_codes=True rounds 8-bit codes with rounding_seed"):
        adam_step_([p], [p.grad], [state["master_param"]], [state["exp_avg"]],
                                 [state["exp_avg_sq"]], [], [state["step"]], state_absmaxes=[state[ABSMAX]],
                                 lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, amsgrad=False,
                                 maximize=False, decoupled_weight_decay=False, stochastic_codes=True)
    with pytest.raises(ValueError, match="state_absmaxes\\[0\\] is missing"):
        adam_step_([p], [p.grad], [state["master_param"]], [state["exp_avg"]],
                                 [state["exp_avg_sq"]], [], [state["step"]], state_absmaxes=[None],
                                 lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                                 amsgrad=False, maximize=False, decoupled_weight_decay=False)
    for key, value in before.items():
        assert_bitwise_equal(state[key], value, key)


@pytest.mark.parametrize("n", [37, QUANT_BLOCK + 37])
def test_a_blocks_absmax_reads_its_last_element(n):
    """The largest value of a block at its very end, past its last whole vector: the absmax is
    that value, not 0 (a block's absmax loop one element short would code it away)."""
    grad = torch.zeros(n)
    grad[-1] = 1.0
    p, ref = torch.nn.Parameter(torch.zeros(n)), torch.nn.Parameter(torch.zeros(n))
    opt = fused_amp.optim.Adam([p], lr=1e-3, state_dtype=torch.uint8, min_8bit_size=0)
    theirs = torch.optim.Adam([ref], lr=1e-3)
    p.grad, ref.grad = grad.clone(), grad.clone()
    opt.step()
    theirs.step()
    last_block = opt.state[p][ABSMAX][:, -1]
    assert_bitwise_equal(last_block[0], theirs.state[ref]["exp_avg"].abs().max(), "exp_avg's absmax")
    assert_bitwise_equal(last_block[1], theirs.state[ref]["exp_avg_sq"].abs().max(), "exp_avg_sq's absmax")
