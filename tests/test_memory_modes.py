"""The memory modes, generic over every optimizer and option set of the registry:
master_weights="remainder" (bf16 param + int16 remainder, bitwise the fp32 master) and
state_dtype=torch.bfloat16 (rounded to nearest even, or stochastically), their checkpoints, and
their convergence on real text."""
import copy
import math

import pytest
import torch

import fused_amp
from fused_amp import ops
from fused_amp.optim import SGD, Adam, AdamW, export_fp32
from fused_amp.optim._memory import _int16, join_master, split_master
from helpers import assert_bitwise_equal, bf16_ties_away, sgd_step_
from optim_registry import CASES, IDS, STATEFUL, STATEFUL_IDS

SHAPES = [(64, 33), (1000,), (7,), (3, 5, 9), (1,)]


def make_params(dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in SHAPES]


def grads_at(step, dtype=torch.bfloat16, scale=1.0):
    gen = torch.Generator().manual_seed(1000 + step)
    return [(torch.randn(s, generator=gen) * scale).to(dtype) for s in SHAPES]


def moments(opt, p):
    """The per-element state p holds (its optimizer's state keys; none before its first step)."""
    group = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
    return {k: opt.state[p][k] for k in opt._state_keys_for(group) if k in opt.state[p]}


def scaled_steps(opt, params, steps, inf_at=3):
    """Steps ``steps`` (a range) through our GradScaler, with an overflow (a skipped step) at
    ``inf_at``; yields after each. The scale stays 256 until the overflow halves it."""
    scaler = fused_amp.GradScaler("cpu", init_scale=256.0 if steps.start <= inf_at else 128.0)
    for step in steps:
        scaler.scale(torch.ones(()))
        for p, g in zip(params, grads_at(step, scale=256.0)):
            p.grad = g
        if step == inf_at:
            params[1].grad[3] = math.inf
        scaler.step(opt)
        scaler.update()
        yield step


# ---- master_weights="remainder" --------------------------------------------------------------

def bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_remainder_master_is_bitwise_the_fp32_master_at_every_step(cls, torch_cls, kw):
    """Fed the same grads (through a scaler, with a skipped step), the master that param and
    remainder hold is the master_weights=True run's at every step, bit for bit; the param is
    that master rounded to nearest with ties away from zero; state_dict() holds it as fp32."""
    ref_params, params = make_params(), make_params()
    ref = cls(ref_params, **kw)
    opt = cls(params, master_weights="remainder", **kw)
    for _ in zip(scaled_steps(ref, ref_params, range(8)), scaled_steps(opt, params, range(8))):
        for i, (p, q) in enumerate(zip(params, ref_params)):
            master = ref.state[q]["master_param"]
            assert opt.state[p]["master_remainder"].dtype == torch.int16
            assert "master_param" not in opt.state[p]
            assert_bitwise_equal(join_master(p, opt.state[p]["master_remainder"]), master, f"param {i}")
            assert_bitwise_equal(p.detach(), split_master(master)[0], f"param {i}")
            for key, value in moments(ref, q).items():
                assert_bitwise_equal(opt.state[p][key], value, key)
    saved, ref_saved = opt.state_dict(), ref.state_dict()
    for i in ref_saved["state"]:
        assert set(saved["state"][i]) == set(ref_saved["state"][i])
        for key, value in ref_saved["state"][i].items():
            assert_bitwise_equal(saved["state"][i][key], value, key)


def tie_masters(n):
    """fp32 masters exactly halfway between two bf16 values (low half 0x8000), both signs, both
    parities of the high half."""
    high = torch.arange(n, dtype=torch.int64) % 256 + 0x3f00 + ((torch.arange(n) % 3 == 0) << 15)
    return ((high << 16) | 0x8000).to(torch.int64).sub_((high >= 0x8000).long() << 32).to(torch.int32).view(torch.float32)


BF16_SCRIPT = """
import sys, torch, fused_amp
from fused_amp.optim import SGD, Adam
from test_memory_modes import tie_masters
gen = torch.Generator().manual_seed(0)
# random bits (a vector of 32 holds a NaN or a subnormal one time in five), normal values (whole
# vectors of neither), ties, and every class at a vector's start and end
patterns = torch.randint(-2**31, 2**31 - 1, (1 << 20,), generator=gen, dtype=torch.int32).view(torch.float32)
special = torch.tensor([0, -2**31, 1, -2**31 + 1, 0x007fffff, -2**31 + 0x007fffff, 0x00800000, 0x7f7fffff,
                        -2**31 + 0x7f7fffff, 0x7f800000, -2**31 + 0x7f800000, 0x7fc00000, 0x7f800001,
                        -2**31 + 0x7fc12345, 0x3f808000, 0x3f818000, 0x3f807fff, 0x7f7f8000],
                       dtype=torch.int32).view(torch.float32)
masters = torch.cat([patterns, torch.randn(1 << 16, generator=gen), tie_masters(4096), special,
                     torch.ones(14), special.flip(0)])
# the params' stores: streaming (fp32 state) and not (8-bit state); lr 0 keeps the masters
for cls, kw in ((SGD, {}), (Adam, {"state_dtype": torch.uint8})):
    p = torch.nn.Parameter(torch.zeros(masters.shape, dtype=torch.bfloat16))
    opt = cls([p], lr=0.0, **kw)
    sd = opt.state_dict()
    sd["state"] = {0: {"master_param": masters.clone(), "step": torch.tensor(0.0)}}
    opt.load_state_dict(sd)
    p.grad = torch.zeros_like(p)
    opt.step()
    master = opt.state[p]["master_param"]
    # NaNs too: all ones from torch's AVX2 and AVX-512 conversions, 0x7fc0 from its portable one
    assert master.isnan().any() and torch.equal(p.detach().view(torch.int16), master.bfloat16().view(torch.int16))
print(fused_amp.build_info()["cpu_bf16_conversion"])
"""


@pytest.mark.parametrize("conversion", ["1", "0"])
def test_bf16_params_round_as_torch_with_and_without_the_avx512_bf16_conversion(conversion):
    """The AVX-512 loops store bf16 with AVX512-BF16's conversion where the CPU has it, and fall
    back to the integer rounding for vectors holding a NaN or a subnormal value, which the
    instruction rounds otherwise (cpu/vec_bits.h). Either way (FUSED_AMP_CPU_BF16=0 turns it
    off) the params written from fp32 masters are torch's conversion of them, bit for bit."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, FUSED_AMP_CPU_BF16=conversion,
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", BF16_SCRIPT], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    expected = (conversion == "1" and " avx512_bf16" in flags
                and torch.backends.cpu.get_cpu_capability() == "AVX512")
    assert out.stdout.split()[-1] == str(expected)


@pytest.mark.parametrize("n", [37, 1000])  # the scalar tail alone; vectors and a tail
def test_remainder_rounds_ties_away_from_zero(n):
    """The one difference from master_weights=True: a master exactly between two bf16 values
    gives the param away from zero (True gives the even one). The step writes it (lr 0 leaves
    the master as it is), and the master comes back exactly."""
    masters = tie_masters(n)
    away = bf16_ties_away(masters)
    assert not torch.equal(masters.bfloat16().view(torch.int16), away.view(torch.int16))
    for cls in (Adam, SGD):
        p = torch.nn.Parameter(masters.bfloat16())
        opt = cls([p], lr=0.0, master_weights="remainder")
        state = {"state": {0: {"master_param": masters.clone(), "step": torch.tensor(0.0)}},
                 "param_groups": copy.deepcopy(opt.state_dict()["param_groups"])}
        opt.load_state_dict(state)
        p.grad = torch.zeros_like(p)
        opt.step()
        assert_bitwise_equal(p.detach(), away)
        assert_bitwise_equal(join_master(p, opt.state[p]["master_remainder"]), masters)


def test_split_and_join_are_exact_on_every_kind_of_float():
    gen = torch.Generator().manual_seed(0)
    patterns = torch.randint(-2**31, 2**31 - 1, (200_000,), generator=gen, dtype=torch.int32)
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 3.0e38, -3.4028235e38, 1e-45, -1e-45, 1e-40,
                            math.inf, -math.inf])
    masters = torch.cat([patterns.view(torch.float32), special, tie_masters(64)])
    param, remainder = split_master(masters)
    back = join_master(param, remainder)
    finite = ~masters.isnan()
    assert_bitwise_equal(back[finite], masters[finite])
    assert back[~finite].isnan().all() and param[~finite].isnan().all()
    # the param is the nearer of the two bf16 values around the master (the farther one on a tie)
    m = masters[finite & (masters.abs() < 3e38)]
    high = m.view(torch.int32).to(torch.int64) >> 16
    as_bf16 = lambda h: _int16(h & 0xffff).view(torch.bfloat16).double()  # noqa: E731
    down, up = as_bf16(high), as_bf16(high + 1)
    nearest = torch.where((up - m.double()).abs() <= (down - m.double()).abs(), up, down)
    assert torch.equal(split_master(m)[0].double(), nearest)


@pytest.mark.parametrize("cls", [Adam, SGD])
def test_the_step_splits_and_joins_every_kind_of_float(cls):
    """The kernels' split and join on random bit patterns (NaNs among them, so that some vectors
    hold a NaN and some not): a step at lr 0 keeps each master, and leaves param and remainder as
    split_master gives them; a NaN master stays a NaN."""
    gen = torch.Generator().manual_seed(1)
    masters = torch.randint(-2**31, 2**31 - 1, (100_003,), generator=gen, dtype=torch.int32).view(torch.float32)
    masters[::97] = math.inf
    p = torch.nn.Parameter(torch.zeros(masters.shape, dtype=torch.bfloat16))
    opt = cls([p], lr=0.0, master_weights="remainder")
    opt.load_state_dict({"state": {0: {"master_param": masters.clone(), "step": torch.tensor(0.0)}},
                         "param_groups": copy.deepcopy(opt.state_dict()["param_groups"])})
    p.grad = torch.zeros_like(p)
    opt.step()  # splits the loaded master
    opt.step()  # joins it, and splits it again
    finite = ~masters.isnan()
    param, remainder = split_master(masters)
    assert_bitwise_equal(bits(p.detach())[finite], bits(param)[finite])
    assert_bitwise_equal(opt.state[p]["master_remainder"][finite], remainder[finite])
    assert p.detach()[~finite].isnan().all()
    back = join_master(p, opt.state[p]["master_remainder"])
    assert_bitwise_equal(back[finite], masters[finite])
    assert back[~finite].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_remainder_needs_bf16_params(dtype):
    params = make_params(dtype)
    with pytest.raises(ValueError, match="master_weights='remainder' needs bfloat16 params.*param 0 of group 0"):
        Adam(params, master_weights="remainder")
    with pytest.raises(ValueError, match="master_weights must be"):
        Adam(make_params(), master_weights="half")
    opt = Adam(make_params(), master_weights="remainder")
    with pytest.raises(ValueError, match="param 0 of group 1"):
        opt.add_param_group({"params": make_params(dtype, seed=1)})


def test_remainder_op_refuses_a_remainder_for_a_half_param():
    p = torch.randn(10).half()
    with pytest.raises(TypeError, match=r"master_params\[0\] has dtype int16, a remainder \(master_weights=.remainder.\), but params\[0\] is Half"):
        sgd_step_([p], [p.clone()], [torch.zeros(10, dtype=torch.int16)], [], [], lr=0.1,
                      momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False)


@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
@pytest.mark.parametrize("source,target", [(True, "remainder"), ("remainder", True),
                                           ("remainder", "remainder")])
def test_checkpoints_move_between_master_modes(cls, torch_cls, kw, source, target):
    """A checkpoint of either mode, loaded into either, continues exactly as the run that never
    stopped in master_weights=True does (the master is what matters; the param follows it)."""
    straight_params, params = make_params(), make_params()
    straight = cls(straight_params, **kw)
    first = cls(params, master_weights=source, **kw)
    list(scaled_steps(straight, straight_params, range(10), inf_at=7))
    list(scaled_steps(first, params, range(5), inf_at=7))
    saved = first.state_dict()
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = cls(resumed_params, master_weights=target, **kw)
    resumed.load_state_dict(saved)
    assert all(g["master_weights"] == target for g in resumed.param_groups)  # the optimizer's mode stays
    list(scaled_steps(resumed, resumed_params, range(5, 10), inf_at=7))
    for p, q in zip(resumed_params, straight_params):
        state = resumed.state[p]
        master = state["master_param"] if target is True else join_master(p, state["master_remainder"])
        assert_bitwise_equal(master, straight.state[q]["master_param"])
    model = torch.nn.Module()
    model.w = torch.nn.ParameterList(resumed_params)
    for p32, q in zip(export_fp32(model, resumed).parameters(), straight_params):
        assert_bitwise_equal(p32.detach(), straight.state[q]["master_param"])


# ---- state_dtype=torch.bfloat16 --------------------------------------------------------------

@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
@pytest.mark.parametrize("master_weights", [True, "remainder"])
def test_bf16_state_is_the_fp32_step_rounded_to_nearest(cls, torch_cls, kw, master_weights):
    """Math in fp32, storage in bf16: from the same (bf16-valued) state, a bf16-state step gives
    the masters of an fp32-state step exactly, and its state is that step's rounded to nearest even."""
    params, ref_params = make_params(), make_params()
    opt = cls(params, state_dtype=torch.bfloat16, master_weights=master_weights, stochastic_rounding=False, **kw)
    ref = cls(ref_params, **kw)
    for p in params:  # state created now (in bf16: Rprop's step_size = lr rounded), for the fp32 run to start from
        opt._init_state(p, opt.param_groups[0], opt._state_keys_for(opt.param_groups[0]))
    for step in range(6):
        for p, q in zip(params, ref_params):
            for key, value in moments(opt, p).items():  # the fp32 run starts from the bf16 state
                ref.state[q][key] = value.float()
        for ps, g in ((params, grads_at(step)), (ref_params, grads_at(step))):
            for p, gi in zip(ps, g):
                p.grad = gi
        opt.step()
        ref.step()
        for p, q in zip(params, ref_params):
            master = ref.state[q]["master_param"]
            ours = (opt.state[p]["master_param"] if master_weights is True
                    else join_master(p, opt.state[p]["master_remainder"]))
            assert_bitwise_equal(ours, master)
            for key, value in moments(ref, q).items():
                assert opt.state[p][key].dtype == torch.bfloat16
                assert_bitwise_equal(opt.state[p][key], value.bfloat16(), key)


def first_momentum(value, n, seed, threads=None, stochastic=True, rounding_seed=7):
    """The momentum buffer SGD stores after its first step from a constant grad: the grad
    itself, rounded to bf16 (one rounding per element, each with its own random bits)."""
    before = torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        p = torch.nn.Parameter(torch.zeros(n))
        opt = SGD([p], lr=0.1, momentum=0.9, state_dtype=torch.bfloat16,
                  stochastic_rounding=stochastic, rounding_seed=rounding_seed)
        p.grad = torch.full((n,), value)
        opt.step()
        return opt.state[p]["momentum_buffer"]
    finally:
        torch.set_num_threads(before)


def test_stochastic_rounding_is_unbiased_and_leaves_bf16_values_exact():
    n = 200_003
    x = 1.0 + 0.3 * 2.0 ** -7  # 30% of the way from 1.0 to the next bf16 value
    up = 1.0 + 2.0 ** -7
    stored = first_momentum(x, n, 0).double()
    assert set(stored.unique().tolist()) == {1.0, up}
    frac_up = (stored == up).double().mean().item()
    sigma = math.sqrt(0.3 * 0.7 / n)
    assert abs(frac_up - 0.3) < 5 * sigma, frac_up
    assert abs(stored.mean().item() - x) < 5 * sigma * 2.0 ** -7
    assert (first_momentum(x, n, 0, stochastic=False).double() == 1.0).all()  # nearest: always down
    assert (first_momentum(up, 1000, 0).double() == up).all()  # a bf16 value is never moved
    assert (first_momentum(-x, 1000, 0).double().abs() >= 1.0).all()  # magnitudes round, signs stay


def test_stochastic_rounding_repeats_exactly_and_follows_the_seed():
    a = first_momentum(1.1, 70_001, 0, threads=1)
    assert_bitwise_equal(first_momentum(1.1, 70_001, 0, threads=3), a)  # no thread dependence
    assert not torch.equal(first_momentum(1.1, 70_001, 0, rounding_seed=8), a)
    torch.manual_seed(5)
    opt = Adam(make_params(), state_dtype=torch.bfloat16, stochastic_rounding=True)
    assert opt.param_groups[0]["rounding_seed"] == 5  # the default follows torch.manual_seed
    assert opt.state_dict()["param_groups"][0]["rounding_seed"] == 5


def test_memory_options_are_checked():
    with pytest.raises(ValueError, match="state_dtype must be torch.float32, torch.bfloat16, torch.uint8 "
                                         r"\(8-bit codes\) or torch.uint4"):
        Adam(make_params(), state_dtype=torch.float16)
    with pytest.raises(ValueError, match="stochastic_rounding=True rounds bf16 state"):
        SGD(make_params(), momentum=0.9, stochastic_rounding=True)
    with pytest.raises(TypeError, match="rounding_seed must be an int"):
        AdamW(make_params(), state_dtype=torch.bfloat16, stochastic_rounding=True, rounding_seed=1.5)


@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_state_dicts_load_across_state_dtypes_and_into_torch(cls, torch_cls, kw):
    params = make_params()
    opt = cls(params, state_dtype=torch.bfloat16, master_weights="remainder", **kw)
    list(scaled_steps(opt, params, range(4)))
    saved = opt.state_dict()
    # into fp32 state: the bf16 values, exactly
    wide = cls([torch.nn.Parameter(p.detach().clone()) for p in params], **kw)
    wide.load_state_dict(saved)
    for p, q in zip(params, wide.param_groups[0]["params"]):
        for key, value in moments(opt, p).items():
            assert wide.state[q][key].dtype == torch.float32
            assert_bitwise_equal(wide.state[q][key], value.float())
    # and back into bf16 state: rounded to nearest
    narrow = cls([torch.nn.Parameter(p.detach().clone()) for p in params], state_dtype=torch.bfloat16, **kw)
    narrow.load_state_dict(wide.state_dict())
    for p, q in zip(params, narrow.param_groups[0]["params"]):
        for key, value in moments(opt, p).items():
            assert_bitwise_equal(narrow.state[q][key], value)
    # into torch.optim through export_fp32: torch steps on from the exact masters
    model = torch.nn.Module()
    model.w = torch.nn.ParameterList(params)
    model32 = export_fp32(model, opt)
    theirs = torch_cls(model32.parameters(), **kw)
    theirs.load_state_dict(saved)
    for p32, p in zip(model32.parameters(), params):
        assert_bitwise_equal(p32.detach(), join_master(p, opt.state[p]["master_remainder"]))
        p32.grad = torch.ones_like(p32)
    theirs.step()


def test_state_bytes_per_param_of_each_mode():
    """Adam's optimizer-side bytes per bf16 param: master 4 (fp32) or 2 (remainder), moments 8
    (fp32) or 4 (bf16)."""
    expected = {(True, torch.float32): 12, ("remainder", torch.float32): 10,
                (True, torch.bfloat16): 8, ("remainder", torch.bfloat16): 6}
    for (master_weights, state_dtype), per_param in expected.items():
        params = make_params()
        opt = Adam(params, master_weights=master_weights, state_dtype=state_dtype)
        for p, g in zip(params, grads_at(0)):
            p.grad = g
        opt.step()
        n = sum(p.numel() for p in params)
        held = sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k != "step")
        assert held == per_param * n, (master_weights, state_dtype)


def test_the_storage_kinds_table_says_what_the_optimizers_hold():
    """ops.storage_kinds() (csrc/storage_kinds.h), which Python's memory options and the kernels
    read: each master kind is a master_weights value whose state key holds a tensor of the
    table's dtype and bits, and each state kind a state_dtype (its option) whose moments have
    the table's dtype and bits per element."""
    kinds = ops.storage_kinds()
    assert [k["option"] for k in kinds["masters"]] == ["fp32", "remainder", "remainder8"]
    assert [k["option"] for k in kinds["states"]] == ["float32", "bfloat16", "uint8", "uint4"]
    assert [k["dtype"] for k in kinds["states"]] == ["float32", "bfloat16", "uint8", "uint8"]
    assert [k["block"] for k in kinds["states"]] == [0, 0, 256, 128]
    assert [k["rounds"] for k in kinds["states"]] == [False, True, True, True]
    assert [k["rounds"] for k in kinds["masters"]] == [False, False, True]
    for kind in kinds["masters"]:
        p = torch.nn.Parameter(torch.randn(300, dtype=torch.bfloat16))
        p.grad = torch.randn_like(p)
        opt = Adam([p], master_weights=kind["option"])
        opt.step()
        held = opt.state[p][kind["key"]]
        assert held.dtype == getattr(torch, kind["dtype"]) and 8 * held.element_size() == kind["bits"], kind
        assert [k for k in opt.state[p] if k.startswith("master")] == [kind["key"]]
        if kind["bf16_params"]:
            with pytest.raises(ValueError, match=f"master_weights='{kind['option']}' needs bfloat16 params"):
                Adam([torch.nn.Parameter(torch.randn(4, dtype=torch.float16))], master_weights=kind["option"])
    for kind in kinds["states"]:
        p = torch.nn.Parameter(torch.randn(5000, dtype=torch.bfloat16))
        p.grad = torch.randn_like(p)
        opt = Adam([p], state_dtype=getattr(torch, kind["option"]), min_8bit_size=0)
        opt.step()
        held = opt.state[p]["exp_avg"]
        assert held.dtype == getattr(torch, kind["dtype"]), kind
        assert 8 * held.numel() * held.element_size() == kind["bits"] * p.numel(), kind


# ---- the same bits on every instruction set -----------------------------------------------------

ISA_SCRIPT = """
import sys, torch
from fused_amp.optim import SGD
gen = torch.Generator().manual_seed(0)
n = 1000
grad = torch.randn(n, generator=gen) * 3
masters = torch.randint(-2**31, 2**31 - 1, (n,), generator=gen, dtype=torch.int32).view(torch.float32)
masters = torch.where(masters.isnan() | masters.isinf(), torch.ones(()), masters)
p = torch.nn.Parameter(torch.zeros(n))  # the momentum buffer: the grad, stochastically rounded
opt = SGD([p], lr=0.1, momentum=0.9, state_dtype=torch.bfloat16, stochastic_rounding=True, rounding_seed=3)
p.grad = grad
opt.step()
q = torch.nn.Parameter(masters.bfloat16())  # the remainder split of arbitrary masters (lr 0)
opt2 = SGD([q], lr=0.0, master_weights="remainder")
sd = opt2.state_dict()
sd["state"] = {0: {"master_param": masters, "step": torch.tensor(0.0)}}
opt2.load_state_dict(sd)
q.grad = torch.zeros_like(q)
opt2.step()
r = torch.nn.Parameter(masters.bfloat16())  # 24-bit masters, rounded stochastically and to nearest
opt3 = SGD([r], lr=0.1, momentum=0.9, master_weights="remainder8", stochastic_rounding=True, rounding_seed=3)
r.grad = grad.bfloat16()
opt3.step()
s = torch.nn.Parameter(masters.bfloat16())
opt4 = SGD([s], lr=0.1, master_weights="remainder8", stochastic_rounding=False)
s.grad = grad.bfloat16()
opt4.step()
out = torch.cat([opt.state[p]["momentum_buffer"].view(torch.int16), q.detach().view(torch.int16),
                 opt2.state[q]["master_remainder"], r.detach().view(torch.int16),
                 opt3.state[r]["master_remainder8"].to(torch.int16), s.detach().view(torch.int16),
                 opt4.state[s]["master_remainder8"].to(torch.int16)])
sys.stdout.write(out.numpy().tobytes().hex())
"""


def test_rounding_bits_are_the_same_on_every_instruction_set():
    """Stochastic rounding and the remainder splits are integer work: the portable, AVX2 and
    AVX-512 loops store the same bits (the float math may differ by FMA; these may not). Each
    instruction set the processor has is compared (AVX-512 only where present)."""
    import os
    import subprocess
    import sys
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    isas = ["default"] + [isa for isa, flag in (("avx2", " avx2"), ("avx512", " avx512bw")) if flag in flags]
    if len(isas) < 2:
        pytest.skip("one instruction set only on this processor")
    outputs = {}
    for isa in isas:
        env = dict(os.environ, ATEN_CPU_CAPABILITY=isa)
        proc = subprocess.run([sys.executable, "-c", ISA_SCRIPT], env=env, capture_output=True, text=True, check=True)
        outputs[isa] = proc.stdout
    assert len(set(outputs.values())) == 1, {isa: out[:64] for isa, out in outputs.items()}
