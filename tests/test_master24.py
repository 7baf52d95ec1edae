"""24-bit masters (master_weights="remainder8"): a bf16 param plus one byte hold an fp32 master
whose low 8 bits are zero. The contract: the step computes what the fp32-master step computes
from the same master and state, then rounds the result to 24 bits (to nearest even, or
stochastically to one of its two 24-bit neighbours); the pair splits and joins every 24-bit
value exactly; checkpoints hold the master as fp32. Generic over the registry."""
import copy
import math

import pytest
import torch

import fused_amp
from fused_amp import ops
from fused_amp.optim import SGD, Adam, AdamW, export_fp32
from fused_amp.optim._memory import join_master24, round_to_24, split_master, split_master24
from helpers import assert_bitwise_equal, sgd_step_
from optim_registry import CASES, IDS, STATEFUL, STATEFUL_IDS

SHAPES = [(64, 33), (1000,), (7,), (3, 5, 9), (1,)]
KEY = "master_remainder8"


def make_params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).bfloat16()) for s in SHAPES]


def set_grads(params, step, scale=1.0):
    gen = torch.Generator().manual_seed(1000 + step)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * scale).bfloat16()


def floats(bits):
    """fp32 values of bit patterns given as Python ints or an int64 tensor."""
    bits = torch.as_tensor(bits, dtype=torch.int64)
    return (bits - ((bits >> 31) << 32)).to(torch.int32).view(torch.float32)


def bits_of(x):
    return x.view(torch.int32).to(torch.int64) & 0xffffffff


def master24(opt, p):
    return join_master24(p, opt.state[p][KEY])


def with_master(opt, p, master):
    """Loads ``master`` (fp32) as p's master into a fresh optimizer like ``opt``, at lr 0."""
    state = {"state": {0: {"master_param": master.clone(), "step": torch.tensor(0.0)}},
             "param_groups": copy.deepcopy(opt.state_dict()["param_groups"])}
    opt.load_state_dict(state)


# ---- the rounding and the split, on boundary values and on every 24-bit value ------------------

def test_rounding_to_24_bits_on_boundary_mantissas():
    """Rounding to nearest even at the 8th bit, carries into the exponent, ties both ways,
    the smallest and largest normals, subnormals, infinities, NaN."""
    cases = {
        0x3f800000: 0x3f800000,  # 1.0
        0x3fffffff: 0x40000000,  # 1.9999998807907104: up into the next binade, 2.0
        0x3f7fffff: 0x3f800000,  # 0.9999999403953552: 1.0
        0x3f800080: 0x3f800000,  # 1 + 2^-16, a tie: to the even 1.0
        0x3f800180: 0x3f800200,  # a tie above an odd mantissa: up
        0x3f80007f: 0x3f800000,  # just below a tie
        0x3f800081: 0x3f800100,  # just above
        0xbf800180: 0xbf800200,  # negative: the magnitude rounds, the sign stays
        0x00800000: 0x00800000,  # the smallest normal
        0x008000ff: 0x00800100,
        0x000000ff: 0x00000100,  # a subnormal rounds on the same grid
        0x0000007f: 0x00000000,
        0x7f7fff00: 0x7f7fff00,  # the largest 24-bit value
        0x7f7fffff: 0x7f800000,  # the largest normal: past the largest 24-bit value + half: inf
        0x7f800000: 0x7f800000,  # inf
        0xff800000: 0xff800000,
    }
    got = round_to_24(floats(list(cases)))
    assert_bitwise_equal(got, floats(list(cases.values())))
    assert round_to_24(torch.tensor([math.nan])).isnan().all()


def test_split_and_join_are_exact_for_every_high_half_and_byte():
    """Every 24-bit value (each bf16 high half over each byte): split into (param, byte) and
    joined back, exactly; the param is the value rounded to bf16 to nearest, ties away from zero
    (as the 16-bit remainder's split); the byte is the value's bits 8-15."""
    values = floats((torch.arange(2**16, dtype=torch.int64)[:, None] << 16 | torch.arange(256)[None, :] << 8).flatten())
    finite = ~values.isnan()
    param, byte = split_master24(values)
    assert_bitwise_equal(byte, ((bits_of(values) >> 8) & 0xff).to(torch.uint8))
    assert_bitwise_equal(param[finite], split_master(values[finite])[0])
    back = join_master24(param, byte)
    assert_bitwise_equal(back[finite], values[finite])
    assert back[~finite].isnan().all() and param[~finite].isnan().all()


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("cls", [Adam, SGD])
def test_the_step_splits_and_joins_every_24_bit_value(cls, stochastic):
    """The kernels' split and join on all 2^24 patterns (a step at lr 0 leaves every 24-bit
    value as it is, to nearest and stochastically: the rounding adds less than the byte below)."""
    values = floats((torch.arange(2**16, dtype=torch.int64)[:, None] << 16 | torch.arange(256)[None, :] << 8).flatten())
    finite = ~values.isnan()
    p = torch.nn.Parameter(torch.zeros(values.shape, dtype=torch.bfloat16))
    opt = cls([p], lr=0.0, master_weights="remainder8", stochastic_rounding=stochastic)
    with_master(opt, p, values)
    p.grad = torch.zeros_like(p)
    opt.step()  # splits the loaded master
    opt.step()  # joins it, rounds (nothing to round) and splits it again
    param, byte = split_master24(values)
    assert_bitwise_equal(p.detach()[finite], param[finite])
    assert_bitwise_equal(opt.state[p][KEY][finite], byte[finite])
    assert master24(opt, p)[~finite].isnan().all()


@pytest.mark.parametrize("n", [4099, 29])
def test_the_kernels_round_the_steps_result_to_the_nearest_24_bit_value(n):
    """SGD moves each 24-bit master m by lr * g = its target's low byte (lr 2^-23, the ulp in
    [1, 2); g an integer below 256, exact in bf16), so that the step's fp32 result is the
    target; the kernels, on their vector and scalar elements, round it to 24 bits to nearest
    even: ties below an even and an odd kept bit, just below and above a tie, a carry into the
    exponent. The reference is round_to_24, checked on these cases above."""
    gen = torch.Generator().manual_seed(0)
    low = torch.randint(0, 256, (n,), generator=gen)
    high = torch.randint(0, 2**15, (n,), generator=gen)  # fp32 mantissa bits 8-22
    low[:9] = torch.tensor([0x80, 0x80, 0x81, 0x81, 0x7f, 0x7f, 0xff, 0x80, 0x00])
    high[:9] = torch.tensor([0x0002, 0x0003, 0x0002, 0x0003, 0x0002, 0x0003, 0x7fff, 0x7fff, 0x0001])
    low[-9:], high[-9:] = low[:9], high[:9]  # in the scalar tail too
    bits = 0x3f800000 | high << 8 | low
    p = torch.nn.Parameter(torch.zeros(n, dtype=torch.bfloat16))
    opt = SGD([p], lr=2.0**-23, master_weights="remainder8", stochastic_rounding=False)
    with_master(opt, p, floats(bits & ~0xff))
    p.grad = (-low).to(torch.bfloat16)
    opt.step()
    assert_bitwise_equal(master24(opt, p), round_to_24(floats(bits)))


# ---- the step ---------------------------------------------------------------------------------

def scaled_steps(opt, params, steps, inf_at=3):
    """Steps through our GradScaler with an overflow (a skipped step) at ``inf_at``."""
    scaler = fused_amp.GradScaler("cpu", init_scale=256.0)
    for step in steps:
        scaler.scale(torch.ones(()))
        set_grads(params, step, 256.0)
        if step == inf_at:
            params[1].grad[3] = math.inf
        scaler.step(opt)
        scaler.update()
        yield step


def fp32_results(cls, kw, opt, params, step):
    """What the fp32-master step gives from ``opt``'s 24-bit masters and state: the fp32 masters
    after one step of an optimizer with master_weights=True loaded with them, and its state."""
    twin_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    twin = cls(twin_params, **kw)
    for p, q in zip(params, twin_params):
        twin.state[q] = {k: v.clone() for k, v in opt.state[p].items() if k != KEY}
        twin.state[q]["master_param"] = master24(opt, p)
    list(scaled_steps(twin, twin_params, range(step, step + 1)))
    return twin, twin_params


@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
@pytest.mark.parametrize("stochastic", [False, True])
def test_a_step_is_the_fp32_step_rounded_to_24_bits(cls, torch_cls, kw, stochastic):
    """At every step (a skipped one among them), from the same 24-bit masters and state: the
    state is bitwise the fp32-master step's, the master is its result rounded to 24 bits (to
    nearest even; stochastically, to one of the two 24-bit values around it, and not always the
    same one), the param the master's high half rounded to nearest, ties away from zero."""
    params = make_params()
    opt = cls(params, master_weights="remainder8", stochastic_rounding=stochastic, **kw)
    list(scaled_steps(opt, params, range(1)))  # masters and state that are not zero
    moved_up = moved_down = 0
    for step in range(1, 6):
        twin, twin_params = fp32_results(cls, kw, opt, params, step)
        list(scaled_steps(opt, params, range(step, step + 1)))
        for i, (p, q) in enumerate(zip(params, twin_params)):
            exact = twin.state[q]["master_param"]
            got = master24(opt, p)
            for key, value in twin.state[q].items():
                if key != "master_param":
                    assert_bitwise_equal(opt.state[p][key], value, f"{key} of param {i}")
            assert_bitwise_equal(p.detach(), split_master24(got)[0], f"param {i}")
            if not stochastic:
                assert_bitwise_equal(got, round_to_24(exact), f"param {i}, step {step}")
                continue
            down = floats(bits_of(exact) & 0xffffff00)  # the magnitude truncated to 24 bits
            up = floats((bits_of(exact) & 0xffffff00) + 0x100)
            assert ((got == down) | (got == up)).all(), f"param {i}, step {step}"
            inexact = exact != down
            moved_up += int((got == up)[inexact].sum())
            moved_down += int((got == down)[inexact].sum())
    if stochastic:
        assert moved_up > 100 and moved_down > 100, (moved_up, moved_down)


def first_masters(lr_times_grad, n, stochastic, steps, threads=None):
    """Masters of n params at 1.0 after ``steps`` SGD steps that each add lr * grad."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        p = torch.nn.Parameter(torch.ones(n, dtype=torch.bfloat16))
        opt = SGD([p], lr=lr_times_grad, master_weights="remainder8", stochastic_rounding=stochastic,
                  rounding_seed=7)
        for _ in range(steps):
            p.grad = -torch.ones_like(p)
            opt.step()
        return master24(opt, p)
    finally:
        torch.set_num_threads(before)


def test_stochastic_rounding_keeps_updates_below_half_an_ulp_in_expectation():
    """The fine-tuning case: at 1.0 a 24-bit ulp is 2^-15; an update of 2^-18 (an eighth of it)
    is lost every step to nearest, and kept in expectation stochastically, for every element (SGD
    without momentum: the random bits still change with the step)."""
    n, steps, u = 100_003, 40, 2.0 ** -18
    assert (first_masters(u, n, False, steps) == 1.0).all()
    got = first_masters(u, n, True, steps).double()
    expected = 1.0 + steps * u
    # each step is a Bernoulli(1/8) move of one ulp on top of the last: the mean's spread is
    # sqrt(steps * p * (1 - p) / n) ulp
    sigma = math.sqrt(steps * (1 / 8) * (7 / 8) / n) * 2.0 ** -15
    assert abs(got.mean().item() - expected) < 5 * sigma, (got.mean().item(), expected)
    # and per element, not only on average: with bits that change every step an element stays
    # unmoved through 40 steps with probability (7/8)^40 = 0.5% (bits fixed across steps: 7/8)
    assert (got == 1.0).double().mean().item() < 0.02
    assert_bitwise_equal(first_masters(u, 70_001, True, 3, threads=1), first_masters(u, 70_001, True, 3, threads=3))


def test_the_default_rounding_is_stochastic():
    p = torch.nn.Parameter(torch.ones(10_000, dtype=torch.bfloat16))
    opt = AdamW([p], lr=1e-5, weight_decay=0.0, master_weights="remainder8")
    for _ in range(100):
        p.grad = -torch.ones_like(p)
        opt.step()
    # each Adam update is about lr = 1e-5, a third of the 24-bit ulp at 1.0: kept in expectation
    assert abs(master24(opt, p).double().mean().item() - (1 + 100 * 1e-5)) < 2e-5


# ---- checkpoints, memory, bad input -------------------------------------------------------------

@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_checkpoints_hold_the_master_as_fp32_and_load_across_modes(cls, torch_cls, kw):
    """state_dict() holds master_param (fp32, the 24-bit value); it loads into
    master_weights=True exactly and into torch through export_fp32; an fp32 master loaded into
    24-bit mode is rounded to nearest even."""
    params = make_params()
    opt = cls(params, master_weights="remainder8", **kw)
    list(scaled_steps(opt, params, range(4)))
    saved = opt.state_dict()
    for i, p in enumerate(params):
        assert KEY not in saved["state"][i]
        assert_bitwise_equal(saved["state"][i]["master_param"], master24(opt, p))
    fp32_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fp32 = cls(fp32_params, **kw)
    fp32.load_state_dict(saved)
    list(scaled_steps(fp32, fp32_params, range(4, 5)))
    for p, q in zip(params, fp32_params):
        assert fp32.state[q]["master_param"].dtype == torch.float32
    # back into 24 bits: the fp32 masters rounded to nearest even
    again_params = [torch.nn.Parameter(p.detach().clone()) for p in fp32_params]
    again = cls(again_params, master_weights="remainder8", **kw)
    again.load_state_dict(fp32.state_dict())
    list(scaled_steps(again, again_params, range(5, 6)))  # after inf_at: a clean step
    model = torch.nn.Module()
    model.w = torch.nn.ParameterList(again_params)
    for p, p32 in zip(again_params, export_fp32(model, again).parameters()):
        assert_bitwise_equal(p32.detach(), master24(again, p))


def test_loading_an_fp32_master_rounds_it_to_nearest():
    masters = floats([0x3f800080, 0x3f800180, 0x3f7fffff, 0xbf800181])
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    opt = Adam([p], lr=0.0, master_weights="remainder8")
    with_master(opt, p, masters)
    p.grad = torch.zeros_like(p)
    opt.step()
    assert_bitwise_equal(master24(opt, p), round_to_24(masters))


def test_state_bytes_per_param():
    """Adam on bf16 params: the byte of the master + fp32 (8), bf16 (4) or 8-bit (2 + an fp32
    absmax per 256 elements per moment) moments."""
    for state_dtype, per_param in ((torch.float32, 9), (torch.bfloat16, 5), (torch.uint8, 3 + 2 * 4 / 256)):
        p = torch.nn.Parameter(torch.randn(256 * 64).bfloat16())
        opt = Adam([p], master_weights="remainder8", state_dtype=state_dtype)
        p.grad = torch.randn_like(p)
        opt.step()
        held = sum(t.numel() * t.element_size() for k, t in opt.state[p].items() if k != "step")
        assert held == per_param * p.numel(), state_dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_24_bit_masters_need_bf16_params(dtype):
    params = [torch.nn.Parameter(torch.randn(4).to(dtype))]
    with pytest.raises(ValueError, match="master_weights='remainder8' needs bfloat16 params.*8-bit remainder.*param 0 of group 0"):
        Adam(params, master_weights="remainder8")
    if dtype == torch.float32:
        return  # the op refuses any master of an fp32 param (test_bad_input)
    with pytest.raises(TypeError, match=r"master_params\[0\] has dtype uint8, a remainder \(master_weights=.remainder8.\), but params\[0\] is Half"):
        sgd_step_(params, [torch.zeros_like(params[0])], [torch.zeros(4, dtype=torch.uint8)], [], [],
                      lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False)


def test_rounding_options_are_checked():
    p = [torch.nn.Parameter(torch.randn(4).bfloat16())]
    Adam(p, master_weights="remainder8", stochastic_rounding=True)  # rounds the masters
    with pytest.raises(ValueError, match="stochastic_rounding=True rounds bf16 state, 8-bit codes and 24-bit masters"):
        Adam(p, master_weights="remainder", stochastic_rounding=True)
    with pytest.raises(TypeError, match="stochastic_rounding must be True, False or None"):
        Adam(p, master_weights="remainder8", stochastic_rounding="yes")
