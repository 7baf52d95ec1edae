"""The CUDA launcher and kernels, run on the CPU by the emulator of tests/cuda_sim/emulator/ (every
CUDA thread a fiber: real barriers, real warp exchanges, shared memory per block, with race,
barrier, warp, init, bounds and alignment checks). Blocks have their real sizes (512 threads); the
"plan" build cuts small chunks (2100 elements, 2080 for the step: whole MX blocks; 2560 for the
8-bit tiles) and launch metadata (3 tensors, 5 blocks per launch; 6 and 10 in the "32 KB" variant),
so that every boundary of the launch plan is reached: flushes when tensors or blocks run out, a
tensor continued in the next launch, empty tensors, chunk tails, threads that loop over a chunk more
than once, aligned and unaligned vector paths. Results are compared with torch (unscale) and with
the CPU ops (optimizers): an element skipped or updated twice shows up at once. Each test runs its
threads in one of the emulator's schedules; test_every_schedule_gives_the_same_bits runs each kernel
in all of them. The "real" build runs the kernels at the sizes a GPU does (chunks of 65536, the
launch metadata of the 4 KB and 32 KB argument limits). tests/test_cuda_emulator.py checks the
emulator itself."""
import ctypes
import math
import zlib
from functools import partial

import pytest
import torch

from fused_amp import ops
from helpers import adam_step_, assert_bitwise_equal, lion_step_, sgd_step_
from cuda_sim.build import SCHEDULES, EmulatorError, build_emulation
from optim_registry import CASES, IDS

DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}
CHUNK = 2100  # the plan build's elementwise chunk
SIZES = [0, 1, 3, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK - 1, 2 * CHUNK, 2 * CHUNK + 1, 0, 5000, 6303, 4, 0, 77]
STEP_CHUNK = CHUNK // 32 * 32  # the step's: whole MX blocks (cuda/step.cuh's StepShape)
# (the multiples of 32 get MX copies in test_every_optimizer_matches_the_cpu_op)
STEP_SIZES = [0, 1, 3, STEP_CHUNK - 1, STEP_CHUNK, STEP_CHUNK + 1, 2 * STEP_CHUNK - 1, 2 * STEP_CHUNK,
              2 * STEP_CHUNK + 1, 0, 4992, 6303, 4, 0, 96]
P = ctypes.c_void_p


@pytest.fixture(scope="module")
def emulation():
    return build_emulation("plan")


@pytest.fixture
def sim(request, emulation):
    """The plan build, its threads in one of the schedules, chosen by the test's name (each test
    compares with the CPU ops bit for bit, so every schedule gives those bits; three times the
    tests would take three times as long)."""
    name = list(SCHEDULES)[zlib.crc32(request.node.nodeid.encode()) % len(SCHEDULES)]
    emulation.set_schedule(name, seed=zlib.crc32(request.node.name.encode()))
    yield emulation
    emulation.set_schedule("in order")


def ptr_array(rows):
    flat = [t.data_ptr() if isinstance(t, torch.Tensor) else 0 for row in rows for t in row]
    return (P * len(flat))(*flat)


def numel_array(tensors):
    return (ctypes.c_int64 * len(tensors))(*[t.numel() for t in tensors])


def fptr(t):
    return P(t.data_ptr()) if t is not None else None


def unaligned_views(sizes, dtype, gen):
    """Tensors that start one element past an aligned address, so no vector path applies."""
    base = torch.randn(sum(sizes) + 1, generator=gen).to(dtype)
    out, at = [], 1
    for n in sizes:
        out.append(base[at:at + n])
        at += n
    return out


@pytest.mark.parametrize("large", [0, 1])
@pytest.mark.parametrize("dtype", list(DTYPE_CODE))
@pytest.mark.parametrize("aligned", [True, False])
def test_unscale_matches_torch(sim, large, dtype, aligned):
    gen = torch.Generator().manual_seed(large * 10 + DTYPE_CODE[dtype])
    tensors = ([torch.randn(n, generator=gen).to(dtype) for n in SIZES] if aligned
               else unaligned_views(SIZES, dtype, gen))
    expected = [t.clone() for t in tensors]
    found, inv = torch.zeros(1), torch.tensor([0.25])
    before = sim.fa_sim_launches()
    sim.fa_sim_unscale(DTYPE_CODE[dtype], len(tensors), ptr_array([[t] for t in tensors]),
                       numel_array(tensors), fptr(found), fptr(inv), large)
    assert sim.fa_sim_launches() - before > 1  # 15 tensors never fit one simulated launch
    torch._amp_foreach_non_finite_check_and_unscale_(expected, torch.zeros(1), inv)
    for i, (a, b) in enumerate(zip(tensors, expected)):
        assert_bitwise_equal(a, b, f"tensor {i}")
    assert found.item() == 0.0
    tensors[-1][-1] = float("nan")
    sim.fa_sim_unscale(DTYPE_CODE[dtype], len(tensors), ptr_array([[t] for t in tensors]),
                       numel_array(tensors), fptr(found), None, large)  # check only
    assert found.item() == 1.0


@pytest.mark.parametrize("hysteresis,bounds", [(1, (math.nan, math.nan)), (2, (0.5, 2.0**18))])
def test_update_scale_matches_torch_and_the_cpu_op(sim, hysteresis, bounds):
    """The one-thread scale update over a run of clean steps and overflows: torch's
    _amp_update_scale_ with the defaults, the CPU op with hysteresis and bounds; growth to inf
    refused."""
    found_seq = [0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 0, 0, 0, 0]
    for start in (2.0**16, 3.0e38):  # 3e38 * 2 overflows: no growth
        scale, tracker, hyst = torch.tensor([start]), torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        ref = [t.clone() for t in (scale, tracker, hyst)]
        limits = (ctypes.c_float * 2)(*bounds)
        for found in found_seq:
            found_inf = torch.tensor([float(found)])
            sim.fa_sim_update_scale(fptr(scale), fptr(tracker), fptr(hyst), fptr(found_inf), ctypes.c_double(2.0),
                                    ctypes.c_double(0.5), 3, hysteresis, limits)
            if hysteresis == 1:
                torch._amp_update_scale_(ref[0], ref[1], found_inf, 2.0, 0.5, 3)
            else:
                ops.update_scale_(ref[0], ref[1], found_inf, 2.0, 0.5, 3, hysteresis=hysteresis,
                                  hysteresis_tracker=ref[2], min_scale=bounds[0], max_scale=bounds[1])
            assert_bitwise_equal(scale, ref[0])
            assert_bitwise_equal(tracker, ref[1])


# the kernels' numbers of the storage kinds (csrc/storage_kinds.h; MasterKind::None is 0)
_KINDS = ops.storage_kinds()
MASTER_KIND = {False: 0, **{kind["option"]: kind["kind"] for kind in _KINDS["masters"]}}
MASTER_KIND[True] = MASTER_KIND["fp32"]
STATE_KIND = {getattr(torch, kind["option"]): kind["kind"] for kind in _KINDS["states"]}  # (uint4: 4-bit codes)


def test_the_launchers_refuse_the_dtypes_they_have_no_kernel_for(sim):
    """cuda_ops.cpp refuses them first; the launchers refuse them too, before any launch."""
    t = torch.zeros(4, dtype=torch.float64)
    found, inv = torch.zeros(1), torch.ones(1)
    before = sim.fa_sim_launches()
    with pytest.raises(EmulatorError, match="float64 params are not supported"):
        sim.step("adam", 7, kind(torch.float64), 1, ptr_array([[t, t, None, t, t, None, found]]), numel_array([t]),
                        (ctypes.c_double * 4)(0.9, 0.99, 1e-8, 0.0), (ctypes.c_int * 3)(0, 0, 0),
                        ctypes.c_double(1e-3), None, None, None, 0, None, ctypes.c_float(0), 0, ctypes.c_int64(0), 0)
    # the Output kind is the descriptor's to pick (an optimizer that writes no param), never the host's
    output_kind = (ctypes.c_int * 4)(DTYPE_CODE[torch.bfloat16], 4, STATE_KIND[torch.float32], 0)  # 4: MasterKind::Output
    with pytest.raises(EmulatorError, match="the host passes no Output master kind"):
        sim.step("adam", 7, output_kind, 1, ptr_array([[t, t, None, t, t, None, found]]), numel_array([t]),
                 (ctypes.c_double * 4)(0.9, 0.99, 1e-8, 0.0), (ctypes.c_int * 3)(0, 0, 0),
                 ctypes.c_double(1e-3), None, None, None, 0, None, ctypes.c_float(0), 0, ctypes.c_int64(0), 0)
    # a master kind the param's dtype cannot hold (a remainder of fp16 params): validation refuses it first
    remainder_kind = (ctypes.c_int * 4)(DTYPE_CODE[torch.float16], MASTER_KIND["remainder"], STATE_KIND[torch.float32], 0)
    with pytest.raises(EmulatorError, match="a master kind its param dtype cannot have"):
        sim.step("adam", 7, remainder_kind, 1, ptr_array([[t, t, t, t, t, None, found]]), numel_array([t]),
                 (ctypes.c_double * 4)(0.9, 0.99, 1e-8, 0.0), (ctypes.c_int * 3)(0, 0, 0),
                 ctypes.c_double(1e-3), None, None, None, 0, None, ctypes.c_float(0), 0, ctypes.c_int64(0), 0)
    # cuda_ops.cpp passes the table index step_ resolved; the harness resolves the name as step_ does (-1: none)
    with pytest.raises(EmulatorError, match="no optimizer at index -1"):
        sim.step("adagrad2", 5, kind(torch.float32), 1, ptr_array([[t, t, None, t, found]]), numel_array([t]),
                 [0.0, 0.0, 1e-10, 0.0], [], ctypes.c_double(1e-3), None, None, None, 0, None, ctypes.c_float(0), 0,
                 ctypes.c_int64(0), 0)
    assert sim.fa_sim_launches() == before


def kind(dtype, master=False, state_dtype=torch.float32, ends=0):
    """The (param dtype, master kind, state dtype) of the simulated launches, and how many lists
    end each tensor's row: 1, its amax slot; 4, also its fp8 copy, the copy's scale and where the
    scale's inverse goes (launch.h)."""
    return (ctypes.c_int * 4)(DTYPE_CODE[dtype], MASTER_KIND[master], STATE_KIND[state_dtype], ends)
# (an MX copy's 4: its amax slot, its codes, no scale, and its e8m0 block scales)


def optimizer_lists(dtype, master, gen, aligned):
    params = ([torch.randn(n, generator=gen).to(dtype) for n in STEP_SIZES] if aligned
              else unaligned_views(STEP_SIZES, dtype, gen))
    grads = [torch.randn(p.shape, generator=gen).to(dtype) for p in params]
    if master == "remainder":  # the remainders of masters that are not bf16 values
        masters = [torch.randint(-2**15, 2**15, p.shape, generator=gen, dtype=torch.int16) for p in params]
    elif master == "remainder8":  # the bytes of 24-bit masters
        masters = [torch.randint(0, 256, p.shape, generator=gen, dtype=torch.uint8) for p in params]
    else:
        masters = [p.float() for p in params] if master else [None] * len(params)
    return params, grads, masters


@pytest.mark.parametrize("large", [0, 1])
@pytest.mark.parametrize("dtype,master,state_dtype,stochastic", [
    (torch.float32, False, torch.float32, False), (torch.bfloat16, True, torch.float32, False),
    (torch.float16, True, torch.float32, False), (torch.bfloat16, False, torch.float32, False),
    (torch.bfloat16, "remainder", torch.float32, False), (torch.bfloat16, "remainder", torch.bfloat16, True),
    (torch.bfloat16, "remainder8", torch.float32, False), (torch.bfloat16, "remainder8", torch.float32, True),
    (torch.bfloat16, "remainder8", torch.bfloat16, True),
    (torch.float32, False, torch.bfloat16, True), (torch.float16, True, torch.bfloat16, True)])
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_matches_cpu_op(sim, large, dtype, master, state_dtype, stochastic, aligned, amsgrad):
    """Every param dtype, master kind (remainders bitwise: the CPU op's and the kernel's
    integer splits and roundings agree) and state dtype, with stochastic rounding of bf16 state
    and 24-bit masters (the same random bits on both: they depend on the element's index in its
    tensor only)."""
    gen = torch.Generator().manual_seed(1)
    params, grads, masters = optimizer_lists(dtype, master, gen, aligned)
    zeros = lambda: [torch.zeros(p.shape, dtype=state_dtype) for p in params]  # noqa: E731
    state = dict(m=zeros(), v=zeros(), vmax=zeros() if amsgrad else [None] * len(params),
                 step=[torch.zeros(1) for _ in params])
    seed = 1234 if stochastic else None
    ref_params, ref_grads = [p.clone() for p in params], [g.clone() for g in grads]
    ref_masters = [m.clone() if m is not None else None for m in masters]
    ref = {k: [t.clone() if t is not None else None for t in v] for k, v in state.items()}
    inv = torch.tensor([0.5])
    hyper = (ctypes.c_double * 4)(0.9, 0.99, 1e-8, 0.01)
    flags = (ctypes.c_int * 3)(1, int(amsgrad), 0)
    for _ in range(3):
        rows = [[p, g, m, ma, va, vm, s] for p, g, m, ma, va, vm, s in zip(
            params, grads, masters, state["m"], state["v"], state["vmax"], state["step"])]
        sim.step("adam", 7, kind(dtype, master, state_dtype), len(params), ptr_array(rows),
                        numel_array(params), hyper, flags, ctypes.c_double(1e-2), None,
                        fptr(inv), None, 1, None, ctypes.c_float(0), int(seed is not None),
                        ctypes.c_int64(seed or 0), large)
        adam_step_(ref_params, ref_grads, ref_masters if master else [], ref["m"], ref["v"],
                       ref["vmax"] if amsgrad else [], ref["step"], lr=1e-2, beta1=0.9, beta2=0.99,
                       eps=1e-8, weight_decay=0.01, amsgrad=amsgrad, maximize=False,
                       decoupled_weight_decay=True, inv_scale=inv, rounding_seed=seed)
    for i in range(len(params)):
        assert_bitwise_equal(grads[i], ref_grads[i])  # left unscaled, as the CPU op leaves them
        torch.testing.assert_close(params[i].float(), ref_params[i].float(), rtol=2e-6, atol=1e-7)
        if state_dtype == torch.bfloat16:
            assert_bitwise_equal(state["m"][i], ref["m"][i])
            assert_bitwise_equal(state["v"][i], ref["v"][i])
        else:
            torch.testing.assert_close(state["v"][i], ref["v"][i], rtol=2e-6, atol=1e-12)
        if master in ("remainder", "remainder8"):
            assert_bitwise_equal(masters[i], ref_masters[i])
            assert_bitwise_equal(params[i], ref_params[i])
        elif master:
            torch.testing.assert_close(masters[i], ref_masters[i], rtol=2e-6, atol=1e-7)
            assert torch.equal(params[i], masters[i].to(dtype))
        assert state["step"][i].item() == 3.0


@pytest.mark.parametrize("large", [0, 1])
@pytest.mark.parametrize("momentum,nesterov", [(0.0, False), (0.9, False), (0.9, True)])
@pytest.mark.parametrize("master,state_dtype,stochastic", [
    (True, torch.float32, False), ("remainder", torch.bfloat16, True), ("remainder8", torch.float32, True),
    ("remainder8", torch.bfloat16, False)])
def test_sgd_matches_cpu_op(sim, large, momentum, nesterov, master, state_dtype, stochastic):
    """Steps are counted with momentum, and without it where the 24-bit masters round
    stochastically (their random bits change with the step)."""
    gen = torch.Generator().manual_seed(2)
    params, grads, masters = optimizer_lists(torch.bfloat16, master, gen, aligned=True)
    bufs = [torch.zeros(p.shape, dtype=state_dtype) for p in params] if momentum else [None] * len(params)
    seed = 99 if stochastic else None
    counted = momentum or master == "remainder8"
    steps = [torch.zeros(1) for _ in params] if counted else [None] * len(params)
    ref_params, ref_masters = [p.clone() for p in params], [m.clone() for m in masters]
    ref_bufs = [b.clone() for b in bufs] if momentum else []
    ref_steps = [s.clone() for s in steps] if counted else []
    hyper = (ctypes.c_double * 3)(momentum, 0.1, 1e-3)
    flags = (ctypes.c_int * 2)(int(nesterov), 0)
    for _ in range(3):
        rows = [[p, g, m, b, s] for p, g, m, b, s in zip(params, grads, masters, bufs, steps)]
        sim.step("sgd", 5, kind(torch.bfloat16, master, state_dtype), len(params), ptr_array(rows),
                       numel_array(params), hyper, flags, ctypes.c_double(0.1), None, None, None, 0, None,
                       ctypes.c_float(0), int(seed is not None), ctypes.c_int64(seed or 0), large)
        sgd_step_(ref_params, grads, ref_masters, ref_bufs, ref_steps, lr=0.1,
                      momentum=momentum, dampening=0.1, weight_decay=1e-3, nesterov=nesterov,
                      maximize=False, rounding_seed=seed)
    for i in range(len(params)):
        if counted:
            assert steps[i].item() == ref_steps[i].item() == 3.0
        if master in ("remainder", "remainder8"):  # the integer split and the random bits: the same on both
            assert_bitwise_equal(masters[i], ref_masters[i])
            assert_bitwise_equal(params[i], ref_params[i])
            if momentum:
                assert_bitwise_equal(bufs[i], ref_bufs[i])
        else:
            torch.testing.assert_close(masters[i], ref_masters[i], rtol=2e-6, atol=1e-7)
            assert torch.equal(params[i], masters[i].bfloat16())


@pytest.mark.parametrize("large", [0, 1])
@pytest.mark.parametrize("dtype,master,state_dtype,stochastic", [
    (torch.float32, False, torch.float32, False), (torch.bfloat16, True, torch.float32, False),
    (torch.float16, True, torch.bfloat16, True), (torch.bfloat16, "remainder", torch.bfloat16, True),
    (torch.bfloat16, "remainder8", torch.float32, True)])
@pytest.mark.parametrize("aligned", [True, False])
def test_lion_matches_cpu_op(sim, large, dtype, master, state_dtype, stochastic, aligned):
    """Lion's kernel against the CPU op: the sign makes any difference in the math a whole lr, so
    everything is compared bit for bit."""
    gen = torch.Generator().manual_seed(4)
    params, grads, masters = optimizer_lists(dtype, master, gen, aligned)
    m = [torch.zeros(p.shape, dtype=state_dtype) for p in params]
    steps = [torch.zeros(1) for _ in params]
    ref_params, ref_grads = [p.clone() for p in params], [g.clone() for g in grads]
    ref_masters = [x.clone() if x is not None else None for x in masters]
    ref_m, ref_steps = [t.clone() for t in m], [t.clone() for t in steps]
    seed = 77 if stochastic else None
    inv = torch.tensor([0.5])
    hyper = (ctypes.c_double * 3)(0.9, 0.99, 0.1)
    for maximize in (0, 1, 0):
        flags = (ctypes.c_int * 1)(maximize)
        rows = [[p, g, x, a, s] for p, g, x, a, s in zip(params, grads, masters, m, steps)]
        sim.step("lion", 5, kind(dtype, master, state_dtype), len(params), ptr_array(rows), numel_array(params),
                        hyper, flags, ctypes.c_double(1e-2), None, fptr(inv), None, 1, None, ctypes.c_float(0),
                        int(stochastic), ctypes.c_int64(seed or 0), large)
        lion_step_(ref_params, ref_grads, ref_masters if master else [], ref_m, ref_steps, lr=1e-2,
                       beta1=0.9, beta2=0.99, weight_decay=0.1, maximize=bool(maximize), inv_scale=inv,
                       rounding_seed=seed)
    for i in range(len(params)):
        assert_bitwise_equal(params[i], ref_params[i], f"param {i}")
        assert_bitwise_equal(grads[i], ref_grads[i], f"grad {i}")
        assert_bitwise_equal(m[i], ref_m[i], f"exp_avg {i}")
        if master:
            assert_bitwise_equal(masters[i], ref_masters[i], f"master {i}")
        assert steps[i].item() == ref_steps[i].item() == 3.0


@pytest.mark.parametrize("large", [0, 1])
@pytest.mark.parametrize("dtype,state_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                               (torch.float16, torch.bfloat16), (torch.bfloat16, torch.bfloat16)])
@pytest.mark.parametrize("aligned", [True, False])
def test_muon_momentum_matches_cpu_op(sim, large, dtype, state_dtype, aligned):
    """Muon's momentum pass against the CPU op, bit for bit: momentum, bf16 updates, unscaled
    grads; nesterov on and off, with a clip; then an overflow that writes nothing."""
    gen = torch.Generator().manual_seed(6)
    params, grads, _ = optimizer_lists(dtype, False, gen, aligned)
    bufs = [torch.randn(p.shape, generator=gen).to(state_dtype) for p in params]
    updates = [torch.zeros(p.shape, dtype=torch.bfloat16) for p in params]
    ref_grads, ref_bufs, ref_updates = ([t.clone() for t in ts] for ts in (grads, bufs, updates))
    inv, norm = torch.tensor([0.5]), torch.tensor([30.0])
    for nesterov, found in ((1, 0.0), (0, 0.0), (1, 1.0)):
        found_inf = torch.tensor([found])
        rows = [[p, g, u, b, None] for p, g, b, u in zip(params, grads, bufs, updates)]
        sim.step("muon_momentum", 5, kind(dtype, False, state_dtype), len(params), ptr_array(rows),
                 numel_array(params), [0.95], [nesterov], ctypes.c_double(0.0), None, fptr(inv), fptr(found_inf), 1,
                 fptr(norm), ctypes.c_float(10.0), 0, ctypes.c_int64(0), large)
        ops.step_("muon_momentum", params, ref_grads, [], [ref_bufs], [], outputs=ref_updates,
                  hyper=dict(momentum=0.95, nesterov=bool(nesterov)), lr=0.0, inv_scale=inv, found_inf=found_inf,
                  grad_norm=norm, max_grad_norm=10.0)
        for i in range(len(params)):
            assert_bitwise_equal(grads[i], ref_grads[i], f"grad {i}")
            assert_bitwise_equal(bufs[i], ref_bufs[i], f"momentum {i}")
            assert_bitwise_equal(updates[i], ref_updates[i], f"update {i}")


def test_overflow_step_changes_nothing(sim):
    gen = torch.Generator().manual_seed(3)
    params, grads, masters = optimizer_lists(torch.float16, True, gen, aligned=True)
    state = [[torch.randn(p.shape, generator=gen) for p in params] for _ in range(2)]
    steps = [torch.full((1,), 5.0) for _ in params]
    snapshot = [t.clone() for t in params + grads + masters + state[0] + state[1] + steps]
    rows = [[p, g, m, a, b, None, s] for p, g, m, a, b, s in zip(params, grads, masters, *state, steps)]
    hyper = (ctypes.c_double * 4)(0.9, 0.999, 1e-8, 0.0)
    flags = (ctypes.c_int * 3)(0, 0, 0)
    # held in names: a tensor made in the call's arguments would be freed before the kernel
    # reads it (AddressSanitizer found that use after free)
    inv_scale, found_inf, norm = torch.tensor([0.5]), torch.ones(1), torch.tensor([3.0])
    sim.step("adam", 7, kind(torch.float16, True), len(params), ptr_array(rows), numel_array(params),
                    hyper, flags, ctypes.c_double(1e-3), None, fptr(inv_scale),
                    fptr(found_inf), 1, fptr(norm), ctypes.c_float(1.0), 0,
                    ctypes.c_int64(0), 0)
    for a, b in zip(params + grads + masters + state[0] + state[1] + steps, snapshot):
        assert torch.equal(a, b)


NORM_KIND = {math.inf: 0, 1.0: 1, 2.0: 2}


@pytest.mark.parametrize("large", [0, 1])
@pytest.mark.parametrize("dtype", list(DTYPE_CODE))
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("norm_type", list(NORM_KIND))
def test_grad_norm_is_as_close_to_the_exact_norm_as_torch(sim, large, dtype, aligned, norm_type):
    """Chunks of 2100 and blocks of 512 threads: every chunk tail, block tree and launch boundary of
    the two-stage reduction. The rule of tests/test_clip.py: no further from the float64 norm
    than torch's own norms (or one fp32 ulp); the same bits on a second run; inf/NaN flagged."""
    gen = torch.Generator().manual_seed(DTYPE_CODE[dtype] + 7 * NORM_KIND[norm_type])
    tensors = ([torch.randn(n, generator=gen).to(dtype) for n in SIZES] if aligned
               else unaligned_views(SIZES, dtype, gen))
    inv = torch.tensor([0.25])

    def run():
        partials = torch.empty(sum(sim.fa_sim_norm_chunks(ctypes.c_int64(t.numel())) for t in tensors) + 1,
                               dtype=torch.float64)
        found, norm = torch.zeros(1), torch.zeros(1)
        sim.fa_sim_grad_norm(DTYPE_CODE[dtype], len(tensors), ptr_array([[t] for t in tensors]),
                             numel_array(tensors), fptr(partials), fptr(found), fptr(inv),
                             NORM_KIND[norm_type], fptr(norm), large)
        return norm, found

    sim.fa_sim_norm_chunks.restype = ctypes.c_int64
    norm, found = run()
    unscaled = [t.double() * 0.25 for t in tensors]
    exact = torch.linalg.vector_norm(torch.cat(unscaled), norm_type)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    torch_error = max((torch.nn.utils.get_total_norm([u.to(work) for u in unscaled if u.numel()],
                                                     norm_type, foreach=f).double() - exact).abs().item()
                      for f in (True, False))
    assert (norm.double() - exact).abs().item() <= max(torch_error, torch.finfo(torch.float32).eps * exact.item())
    assert found.item() == 0.0
    assert_bitwise_equal(run()[0], norm)
    tensors[-1][-1] = float("inf")
    norm, found = run()
    assert found.item() == 1.0 and norm.isinf().item()


@pytest.mark.parametrize("large", [0, 1])
@pytest.mark.parametrize("max_norm", [1.0, 1e6])  # clips; does not clip (grads stay as they are)
def test_clipped_adam_matches_cpu_op(sim, large, max_norm):
    gen = torch.Generator().manual_seed(4)
    params, grads, masters = optimizer_lists(torch.bfloat16, True, gen, aligned=True)
    state = [[torch.zeros(p.shape) for p in params] for _ in range(2)]
    steps = [torch.zeros(1) for _ in params]
    ref = [[t.clone() for t in ts] for ts in (params, grads, masters, *state, steps)]
    inv, norm = torch.tensor([0.5]), torch.tensor([7.5])
    rows = [[p, g, m, a, b, None, s] for p, g, m, a, b, s in zip(params, grads, masters, *state, steps)]
    hyper = (ctypes.c_double * 4)(0.9, 0.999, 1e-8, 0.0)
    flags = (ctypes.c_int * 3)(0, 0, 0)
    sim.step("adam", 7, kind(torch.bfloat16, True), len(params), ptr_array(rows), numel_array(params),
                    hyper, flags, ctypes.c_double(1e-3), None, fptr(inv), None, 1, fptr(norm),
                    ctypes.c_float(max_norm), 0, ctypes.c_int64(0), large)
    adam_step_(ref[0], ref[1], ref[2], ref[3], ref[4], [], ref[5], lr=1e-3, beta1=0.9,
                   beta2=0.999, eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False,
                   decoupled_weight_decay=False, inv_scale=inv, grad_norm=norm.reshape(()),
                   max_grad_norm=max_norm)
    for i in range(len(params)):
        assert_bitwise_equal(grads[i], ref[1][i])  # unscaled and clipped, as the CPU op leaves them
        torch.testing.assert_close(masters[i], ref[2][i], rtol=2e-6, atol=1e-7)


# ---- 8-bit state: tiles of whole quant blocks (csrc/cuda/step_states.cuh) ----------------------
# The tile kernels run 512 threads per block (tiles of 2048 elements, 8 quant blocks of 256) over
# chunks of 2560 elements in the plan build, so sizes around 256, 2048 and 2560 reach a quant
# block's tail, a tile that ends inside a chunk, a chunk that ends inside a tile and a tensor
# continued in the next launch. Everything is compared bit for bit: the CPU loops of these
# machines use fused multiply-adds as the kernels do (as in the tests above).
Q8_SIZES = [0, 1, 255, 256, 257, 2047, 2048, 2049, 2560, 2561, 0, 5200, 7700, 4, 0, 300]
Q8 = STATE_KIND[torch.uint8]  # the state kind of 8-bit codes
Q4 = STATE_KIND[torch.uint4]  # of 4-bit codes
# (a one-element param's 4-bit codes would be its 8-bit ones: fused_amp keeps fp32 state there)
Q4_SIZES = [0, 2, 127, 128, 129, 2047, 2048, 2049, 2560, 2561, 0, 5200, 7701, 4, 0, 300]


def q8_kind(dtype, master=False, ends=0, codes=Q8):
    return (ctypes.c_int * 4)(DTYPE_CODE[dtype], MASTER_KIND[master], codes, ends)


def q8_lists(dtype, master, gen, aligned, sizes=Q8_SIZES):
    params = ([torch.randn(n, generator=gen).to(dtype) for n in sizes] if aligned
              else unaligned_views(sizes, dtype, gen))
    grads = [torch.randn(p.shape, generator=gen).to(dtype) for p in params]
    if master == "remainder":
        masters = [torch.randint(-2**15, 2**15, p.shape, generator=gen, dtype=torch.int16) for p in params]
    elif master == "remainder8":
        masters = [torch.randint(0, 256, p.shape, generator=gen, dtype=torch.uint8) for p in params]
    else:
        masters = [p.float() for p in params] if master else [None] * len(params)
    return params, grads, masters


def codes_and_absmax(params, rows, codes=Q8):
    """Zero codes (8-bit: shaped as the param; 4-bit: two per byte) and absmax rows."""
    block = 256 if codes == Q8 else 128
    shape = (lambda p: p.shape) if codes == Q8 else (lambda p: ((p.numel() + 1) // 2,))
    codes = [[torch.zeros(shape(p), dtype=torch.uint8) for p in params] for _ in range(rows)]
    absmax = [torch.zeros(rows, (p.numel() + block - 1) // block) for p in params]
    return codes, absmax


def assert_codes_match(codes, ref_codes, absmax, ref_absmax, msg):
    assert_bitwise_equal(codes, ref_codes, f"{msg} codes")
    assert_bitwise_equal(absmax, ref_absmax, f"{msg} absmax")


@pytest.mark.parametrize("large", [0, 1])
# the harness's `stochastic`: 0 to nearest, 1 bf16 state and 24-bit masters stochastically, 2 the
# 8-bit codes too
@pytest.mark.parametrize("dtype,master,stochastic,state", [
    (torch.float32, False, 0, Q8), (torch.bfloat16, True, 0, Q8), (torch.float16, True, 0, Q8),
    (torch.bfloat16, "remainder", 0, Q8), (torch.bfloat16, "remainder8", 1, Q8), (torch.float32, False, 2, Q8),
    (torch.float16, True, 2, Q8), (torch.bfloat16, "remainder8", 2, Q8), (torch.float32, False, 0, Q4),
    (torch.bfloat16, "remainder8", 1, Q4)])
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_with_codes_matches_cpu_op(sim, large, dtype, master, stochastic, state, aligned, amsgrad):
    """The tiles' codes and absmax are the CPU loops' (cpu/quantized_state.h) bit for bit, 8- and
    4-bit: the same quant blocks, the same fp32 math, the same map and rounding (stochastic codes
    take the same random bits of the element's index); then an overflow step writes nothing."""
    gen = torch.Generator().manual_seed(11)
    params, grads, masters = q8_lists(dtype, master, gen, aligned, Q4_SIZES if state == Q4 else Q8_SIZES)
    rows = 3 if amsgrad else 2
    codes, absmax = codes_and_absmax(params, rows, state)
    if not amsgrad:
        codes.append([None] * len(params))
    steps = [torch.zeros(1) for _ in params]
    ref = [[t.clone() if t is not None else None for t in ts]
           for ts in (params, grads, masters, *codes, absmax, steps)]
    seed = 4321 if stochastic else None
    inv = torch.tensor([0.5])
    hyper = (ctypes.c_double * 4)(0.9, 0.99, 1e-8, 0.01)
    flags = (ctypes.c_int * 3)(1, int(amsgrad), 0)
    for found in (0.0, 0.0, 0.0, 1.0):
        found_inf = torch.tensor([found])
        rows_ = [list(r) for r in zip(params, grads, masters, *codes, steps, absmax)]
        sim.step("adam", 7, q8_kind(dtype, master, codes=state), len(params), ptr_array(rows_), numel_array(params), hyper,
                        flags, ctypes.c_double(1e-2), None, fptr(inv), fptr(found_inf), 1, None,
                        ctypes.c_float(0), stochastic, ctypes.c_int64(seed or 0), large)
        adam_step_(ref[0], ref[1], ref[2] if master else [], ref[3], ref[4], ref[5] if amsgrad else [],
                       ref[7], state_absmaxes=ref[6], lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8,
                       weight_decay=0.01, amsgrad=amsgrad, maximize=False, decoupled_weight_decay=True,
                       inv_scale=inv, found_inf=found_inf, rounding_seed=seed,
                       stochastic_codes=stochastic == 2)
    for i in range(len(params)):
        for k in range(rows):
            assert_codes_match(codes[k][i], ref[3 + k][i], absmax[i][k], ref[6][i][k], f"tensor {i} state {k}")
        assert_bitwise_equal(grads[i], ref[1][i], f"grad {i}")
        assert_bitwise_equal(params[i], ref[0][i], f"param {i}")
        if master:
            assert_bitwise_equal(masters[i], ref[2][i], f"master {i}")
        assert steps[i].item() == ref[7][i].item() == 3.0


def torch_amax(params):
    """What torchao's precompute_float8_dynamic_scale_for_fsdp reads: each param's inf-norm (0 for
    an empty one, where torch has none and the step writes 0)."""
    norms = iter(torch._foreach_norm([p for p in params if p.numel()], ord=math.inf))
    return torch.stack([next(norms).float() if p.numel() else torch.zeros(()) for p in params])


# Every optimizer of the table, by its registry entries: each storage kind against the CPU op.
STORAGE = {  # param dtype, master, state dtype (Q8, Q4: 8- and 4-bit codes), the harness's `stochastic`
    "fp32 state": (torch.float32, False, torch.float32, 0),
    "half + fp32 master": (torch.float16, True, torch.float32, 0),
    "remainder + bf16 state, stochastic": (torch.bfloat16, "remainder", torch.bfloat16, 1),
    "24-bit + 8-bit state, stochastic": (torch.bfloat16, "remainder8", Q8, 2),
    "fp32 master + 8-bit state": (torch.bfloat16, True, Q8, 0),
    "24-bit + 4-bit state, stochastic": (torch.bfloat16, "remainder8", Q4, 1),
    "half + fp32 master, 4-bit state": (torch.float16, True, Q4, 0),
}


@pytest.mark.parametrize("storage", list(STORAGE))
@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_every_optimizer_matches_the_cpu_op(sim, cls, torch_cls, kw, storage):
    """The kernel of each optimizer of the table (optimizer_step.cu, generic over its
    descriptor) against the CPU op, bit for bit: params, masters, grads left unscaled, every state
    kept (8-bit: codes and absmax), the weight amax (fp8 scaling) of each step, which is torch's
    max(abs(param)) of the params written, the fp8 copies (MX where a param is whole blocks of 32,
    delayed scaling's otherwise), three steps and an overflow step that writes nothing."""
    dtype, master, state_dtype, stochastic = STORAGE[storage]
    opt = cls([torch.nn.Parameter(torch.zeros(1))], **kw)
    group = opt.param_groups[0]
    name, keys = opt._kernel, opt._state_keys_for(group)
    if not keys:  # (SGD without momentum) no state to store: the op's launches have fp32 state
        state_dtype = torch.float32
    quantized = state_dtype in (Q8, Q4)
    gen = torch.Generator().manual_seed(5)
    lists = partial(q8_lists, sizes=Q4_SIZES if state_dtype == Q4 else Q8_SIZES) if quantized else optimizer_lists
    params, grads, masters = lists(dtype, master, gen, True)
    table = ops.optimizers()[name]
    hyper = opt._hyper(group)
    initial = opt._initial_state(group)
    if quantized:
        kept, absmax = codes_and_absmax(params, len(keys), state_dtype)
    else:
        kept = [[torch.full(p.shape, float(initial.get(key, 0)), dtype=state_dtype) for p in params] for key in keys]
        absmax = [None] * len(params)
    by_key = dict(zip(keys, kept))
    states = [by_key.get(key, [None] * len(params)) for key, _, _ in table["states"]]
    steps = [torch.zeros(1) for _ in params]
    # a scalar state (NAdam's mu_product) follows the step count in each tensor's lists
    scalars = [[torch.full((1,), 0.75) for _ in params]] if table["scalar"] else []
    ref = [[t.clone() if t is not None else None for t in ts] for ts in (params, grads, masters, *kept, steps)]
    ref_absmax = [a.clone() if a is not None else None for a in absmax]
    ref_scalars = [[t.clone() for t in ts] for ts in scalars]
    seed = 77 if stochastic else None
    inv = torch.tensor([0.5])
    lr = float(group["lr"])
    with_amax = not table["writes_output"]  # (an optimizer that writes outputs writes no weight)
    ref_amax = torch.full((len(params),), -1.0)
    # fp8 copies: MX for params of whole blocks of 32 (their e8m0 scales written), else each scale
    # puts its param elsewhere in e4m3's range (and the step writes its inverse)
    copies, ref_copies = ([torch.zeros(p.shape, dtype=torch.float8_e4m3fn) for p in params] for _ in range(2))
    mx = [p.numel() % 32 == 0 for p in params]
    mx_scales, ref_mx_scales = ([torch.zeros(p.numel() // 32, dtype=torch.uint8) for p in params] for _ in range(2))
    scales = [torch.tensor([(1.0, 2.0 ** -9, 40.0, 0.37, 1e4)[i % 5]]) for i in range(len(params))]
    invs, ref_invs = ([torch.zeros(1) if not m else torch.empty(0) for m in mx] for _ in range(2))
    for found in (0.0, 0.0, 0.0, 1.0):
        found_inf = torch.tensor([found])
        slots = [torch.zeros(1, dtype=torch.int32) for _ in params]  # the kernels' amax slots
        ends = [([slot, copy, None, mx_scale] if m else [slot, copy, scale, inv]) if with_amax else []
                for slot, copy, scale, inv, m, mx_scale in zip(slots, copies, scales, invs, mx, mx_scales)]
        rows = [list(r) + ([a] if quantized else []) + end
                for r, a, end in zip(zip(params, grads, masters, *states, steps, *scalars), absmax, ends)]
        sim.step(name, 4 + len(table["states"]) + len(scalars),
                 (partial(q8_kind, codes=state_dtype) if quantized else partial(kind, state_dtype=state_dtype))(
                     dtype, master, ends=4 if with_amax else 0),
                 len(params), ptr_array(rows), numel_array(params), [hyper[h] for h in table["hyper"]], [],
                 ctypes.c_double(lr), None, fptr(inv), fptr(found_inf), 1, None, ctypes.c_float(0), stochastic,
                 ctypes.c_int64(seed or 0), 0)
        float8 = dict(float8_weights=ref_copies, float8_indices=list(range(len(params))), float8_scale_invs=ref_invs,
                      float8_scales=[r.view(torch.float8_e8m0fnu) if m else scale
                                     for r, m, scale in zip(ref_mx_scales, mx, scales)]) if with_amax else {}
        ops.step_(name, ref[0], ref[1], ref[2] if master else [], ref[3:3 + len(keys)], ref[-1], hyper=hyper, lr=lr,
                  state_absmaxes=ref_absmax if quantized else [], scalar_states=(ref_scalars or [[]])[0],
                  inv_scale=inv, found_inf=found_inf, weight_amax=ref_amax if with_amax else None,
                  rounding_seed=seed, stochastic_codes=stochastic == 2, **float8)
        if with_amax and not found:
            assert_bitwise_equal(torch.cat(slots).view(torch.float32), ref_amax, "amax slots")
            assert_bitwise_equal(ref_amax, torch_amax(ref[0]), "torch's amax")
    if with_amax:  # the overflow step left the amax of the last clean one
        assert_bitwise_equal(ref_amax, torch_amax(ref[0]), "amax after overflow")
        for i, (copy, ref_copy) in enumerate(zip(copies, ref_copies)):
            assert_bitwise_equal(copy.view(torch.uint8), ref_copy.view(torch.uint8), f"fp8 copy {i}")
            assert_bitwise_equal(invs[i], ref_invs[i], f"scale_inv {i}")
            assert_bitwise_equal(mx_scales[i], ref_mx_scales[i], f"MX scales {i}")
        assert_bitwise_equal(ref_invs[1], torch.tensor([2.0 ** 9]), "scale_inv 1 (1 / 2^-9)")
        assert any(m and s.numel() and s.unique().numel() > 1 for m, s in zip(mx, ref_mx_scales)), "MX scales"
    for i in range(len(params)):
        assert_bitwise_equal(grads[i], ref[1][i], f"grad {i}")
        assert_bitwise_equal(params[i], ref[0][i], f"param {i}")
        if master:
            assert_bitwise_equal(masters[i], ref[2][i], f"master {i}")
        for k, key in enumerate(keys):
            assert_bitwise_equal(kept[k][i], ref[3 + k][i], f"{key} {i}")
        if quantized:
            assert_bitwise_equal(absmax[i], ref_absmax[i], f"absmax {i}")
        for ts, ref_ts in zip(scalars, ref_scalars):
            assert_bitwise_equal(ts[i], ref_ts[i], f"{table['scalar']} {i}")
            assert ts[i].item() != 0.75  # advanced by the three clean steps
        assert steps[i].item() == ref[-1][i].item() == 3.0


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("dtype,master", [(torch.float32, False), (torch.bfloat16, True), (torch.float16, True),
                                          (torch.bfloat16, "remainder")])
def test_mx_copies_match_the_cpu_op_on_the_vector_and_the_strided_path(sim, dtype, master, aligned):
    """MX copies (e8m0 scale per block of 32, ops/float8.h): aligned, a block is held by 8
    neighbouring lanes; one element off, by one element of each lane of a warp. Blocks whose amax
    spans many powers of two, a zero block, inf and NaN; chunk boundaries inside tensors."""
    gen = torch.Generator().manual_seed(21)
    sizes = [32, 96, STEP_CHUNK + 32, 2 * STEP_CHUNK, 0, 4 * STEP_CHUNK + 64]
    values = torch.randn(sum(sizes), generator=gen).reshape(-1, 32)
    values *= torch.exp2(torch.randint(-20, 20, (values.shape[0], 1), generator=gen).float())
    values[1], values[3, 4], values[5, 6], values[7, 8] = 0.0, float("inf"), float("nan"), -float("inf")
    base = torch.cat([torch.zeros(0 if aligned else 1), values.flatten()]).to(dtype)
    params = list(base[0 if aligned else 1:].split(sizes))
    grads = [torch.randn(p.shape, generator=gen).to(dtype) for p in params]
    grads[1][:32] = 0.0  # (the zero block stays zero)
    if master == "remainder":  # (remainders of zero: a zero master)
        masters = [torch.randint(-2**15, 2**15, p.shape, generator=gen, dtype=torch.int16) for p in params]
        masters[1][:32] = 0
    else:
        masters = [p.float() for p in params] if master else [None] * len(params)
    copies, ref_copies = ([torch.zeros(p.shape, dtype=torch.float8_e4m3fn) for p in params] for _ in range(2))
    scales, ref_scales = ([torch.zeros(p.numel() // 32, dtype=torch.uint8) for p in params] for _ in range(2))
    ref = [[t.clone() if t is not None else None for t in ts] for ts in (params, grads, masters)]
    for found in (0.0, 0.0, 1.0):
        found_inf = torch.tensor([found])
        rows = [[p, g, m, None, None, None, c, None, sc]
                for p, g, m, c, sc in zip(params, grads, masters, copies, scales)]
        sim.step("sgd", 5, kind(dtype, master, ends=4), len(params), ptr_array(rows), numel_array(params),
                 (ctypes.c_double * 3)(0.0, 0.0, 1e-2), (ctypes.c_int * 2)(0, 0), ctypes.c_double(0.25), None, None,
                 fptr(found_inf), 0, None, ctypes.c_float(0), 0, ctypes.c_int64(0), 0)
        ops.step_("sgd", ref[0], ref[1], ref[2] if master else [], [], [], lr=0.25, found_inf=found_inf,
                  hyper=dict(momentum=0.0, dampening=0.0, weight_decay=1e-2, nesterov=False, maximize=False),
                  float8_weights=ref_copies, float8_scales=[t.view(torch.float8_e8m0fnu) for t in ref_scales],
                  float8_indices=list(range(len(params))))
    for i in range(len(params)):
        assert_bitwise_equal(params[i], ref[0][i], f"param {i}")
        # (copies compared as fp8 values: NaN meets NaN, whose sign inf - inf leaves to the machine)
        assert_bitwise_equal(copies[i].float(), ref_copies[i].float(), f"MX copy {i}")
        assert_bitwise_equal(scales[i], ref_scales[i], f"MX scales {i}")
    assert ref_scales[1][0] == 0 and (ref_scales[2] == 255).any()  # a zero block, a NaN block
    assert ref_scales[2].unique().numel() > 10  # the blocks' scales differ


@pytest.mark.parametrize("large", [0, 1])
@pytest.mark.parametrize("momentum,nesterov", [(0.9, False), (0.9, True)])
@pytest.mark.parametrize("master", [True, "remainder8"])
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("stochastic", [0, 2])
def test_sgd_with_8bit_momentum_matches_cpu_op(sim, large, momentum, nesterov, master, aligned, stochastic):
    """The first step starts the buffer from the grad (the codes are not read), later ones read it."""
    gen = torch.Generator().manual_seed(12)
    params, grads, masters = q8_lists(torch.bfloat16, master, gen, aligned)
    codes, absmax = codes_and_absmax(params, 1)
    steps = [torch.zeros(1) for _ in params]
    ref = [[t.clone() for t in ts] for ts in (params, masters, codes[0], absmax, steps)]
    hyper = (ctypes.c_double * 3)(momentum, 0.1, 1e-3)
    flags = (ctypes.c_int * 2)(int(nesterov), 0)
    for _ in range(3):
        rows = [list(r) for r in zip(params, grads, masters, codes[0], steps, absmax)]
        sim.step("sgd", 5, q8_kind(torch.bfloat16, master), len(params), ptr_array(rows), numel_array(params),
                       hyper, flags, ctypes.c_double(0.1), None, None, None, 0, None, ctypes.c_float(0), stochastic,
                       ctypes.c_int64(55), large)
        sgd_step_(ref[0], grads, ref[1], ref[2], ref[4], state_absmaxes=ref[3], lr=0.1, momentum=momentum,
                      dampening=0.1, weight_decay=1e-3, nesterov=nesterov, maximize=False,
                      rounding_seed=55 if stochastic else None, stochastic_codes=stochastic == 2)
    for i in range(len(params)):
        assert_codes_match(codes[0][i], ref[2][i], absmax[i][0], ref[3][i][0], f"tensor {i}")
        assert steps[i].item() == ref[4][i].item() == 3.0
        assert_bitwise_equal(masters[i], ref[1][i], f"master {i}")
        assert_bitwise_equal(params[i], ref[0][i], f"param {i}")


@pytest.mark.parametrize("large", [0, 1])
@pytest.mark.parametrize("dtype,master", [(torch.float32, False), (torch.bfloat16, "remainder8")])
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("stochastic", [0, 2])
def test_lion_with_8bit_state_matches_cpu_op(sim, large, dtype, master, aligned, stochastic):
    gen = torch.Generator().manual_seed(13)
    params, grads, masters = q8_lists(dtype, master, gen, aligned)
    codes, absmax = codes_and_absmax(params, 1)
    steps = [torch.zeros(1) for _ in params]
    ref = [[t.clone() if t is not None else None for t in ts] for ts in (params, masters, codes[0], absmax, steps)]
    hyper = (ctypes.c_double * 3)(0.9, 0.99, 0.1)
    flags = (ctypes.c_int * 1)(0)
    for _ in range(3):
        rows = [list(r) for r in zip(params, grads, masters, codes[0], steps, absmax)]
        sim.step("lion", 5, q8_kind(dtype, master), len(params), ptr_array(rows), numel_array(params), hyper, flags,
                        ctypes.c_double(1e-2), None, None, None, 0, None, ctypes.c_float(0), stochastic,
                        ctypes.c_int64(66), large)
        lion_step_(ref[0], grads, ref[1] if master else [], ref[2], ref[4], state_absmaxes=ref[3], lr=1e-2,
                       beta1=0.9, beta2=0.99, weight_decay=0.1, maximize=False,
                       rounding_seed=66 if stochastic else None, stochastic_codes=stochastic == 2)
    for i in range(len(params)):
        assert_codes_match(codes[0][i], ref[2][i], absmax[i][0], ref[3][i][0], f"tensor {i}")
        assert_bitwise_equal(params[i], ref[0][i], f"param {i}")


@pytest.mark.parametrize("large", [0, 1])
@pytest.mark.parametrize("aligned", [True, False])
def test_muon_momentum_with_8bit_state_matches_cpu_op(sim, large, aligned):
    gen = torch.Generator().manual_seed(14)
    params, grads, _ = q8_lists(torch.bfloat16, False, gen, aligned)
    codes, absmax = codes_and_absmax(params, 1)
    updates = [torch.zeros(p.shape, dtype=torch.bfloat16) for p in params]
    ref = [[t.clone() for t in ts] for ts in (codes[0], absmax, updates)]
    for nesterov in (1, 0, 1):
        rows = [[p, g, u, c, None, a] for p, g, c, u, a in zip(params, grads, codes[0], updates, absmax)]
        sim.step("muon_momentum", 5, q8_kind(torch.bfloat16), len(params), ptr_array(rows), numel_array(params),
                 [0.95], [nesterov], ctypes.c_double(0.0), None, None, None, 0, None, ctypes.c_float(0), 0,
                 ctypes.c_int64(0), large)
        ops.step_("muon_momentum", params, grads, [], [ref[0]], [], outputs=ref[2], state_absmaxes=ref[1],
                  hyper=dict(momentum=0.95, nesterov=bool(nesterov)), lr=0.0)
    for i in range(len(params)):
        assert_codes_match(codes[0][i], ref[0][i], absmax[i][0], ref[1][i][0], f"tensor {i}")
        assert_bitwise_equal(updates[i], ref[2][i], f"update {i}")


def test_8bit_state_keeps_a_nan_as_a_nan_block(sim):
    """A NaN in a quant block's new state makes its absmax NaN and its codes 0, as on the CPU (the
    next step reads the whole block as NaN); a block of zeros stores absmax 0."""
    params = [torch.randn(1000), torch.zeros(600)]
    grads = [torch.randn(1000), torch.zeros(600)]
    grads[0][300] = float("nan")
    codes, absmax = codes_and_absmax(params, 2)
    steps = [torch.zeros(1) for _ in params]
    ref = [[t.clone() for t in ts] for ts in (params, grads, *codes, absmax, steps)]
    hyper = (ctypes.c_double * 4)(0.9, 0.999, 1e-8, 0.0)
    flags = (ctypes.c_int * 3)(0, 0, 0)
    rows = [list(r) for r in zip(params, grads, [None, None], *codes, [None, None], steps, absmax)]
    sim.step("adam", 7, q8_kind(torch.float32), 2, ptr_array(rows), numel_array(params), hyper, flags,
                    ctypes.c_double(1e-3), None, None, None, 0, None, ctypes.c_float(0), 0, ctypes.c_int64(0), 0)
    adam_step_(ref[0], ref[1], [], ref[2], ref[3], [], ref[5], state_absmaxes=ref[4], lr=1e-3, beta1=0.9,
                   beta2=0.999, eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False,
                   decoupled_weight_decay=False)
    assert absmax[0][:, 1].isnan().all() and (codes[0][0][256:512] == 0).all()
    assert (absmax[1] == 0).all()
    for k in range(2):
        assert_codes_match(codes[k][0], ref[2 + k][0], absmax[0][k], ref[4][0][k], f"state {k}")


# ---- every schedule: the same bits ----------------------------------------------------------------

def run_unscale(sim, gen):
    tensors = [torch.randn(n, generator=gen).half() * 1000 for n in SIZES]
    found = torch.zeros(1)
    inv = torch.tensor([1 / 1024])
    sim.fa_sim_unscale(DTYPE_CODE[torch.float16], len(tensors), ptr_array([[t] for t in tensors]),
                       numel_array(tensors), fptr(found), fptr(inv), 0)
    return tensors + [found]


def run_grad_norm(sim, gen):
    tensors = [torch.randn(n, generator=gen).bfloat16() for n in SIZES]
    partials = torch.zeros(sum(sim.fa_sim_norm_chunks(ctypes.c_int64(t.numel())) for t in tensors) + 1,
                           dtype=torch.float64)
    found, norm, inv = torch.zeros(1), torch.zeros(1), torch.tensor([0.5])
    sim.fa_sim_grad_norm(DTYPE_CODE[torch.bfloat16], len(tensors), ptr_array([[t] for t in tensors]),
                         numel_array(tensors), fptr(partials), fptr(found), fptr(inv), NORM_KIND[2.0],
                         fptr(norm), 1)
    return [partials, norm, found]


def run_adam(state_dtype, master, stochastic):
    def run(sim, gen):
        q8 = state_dtype == "8-bit"
        params, grads, masters = (q8_lists if q8 else optimizer_lists)(torch.bfloat16, master, gen, True)
        if q8:
            codes, absmax = codes_and_absmax(params, 3)
            rows = [list(r) for r in zip(params, grads, masters, *codes, [torch.zeros(1) for _ in params], absmax)]
            k = q8_kind(torch.bfloat16, master)
        else:
            states = [[torch.zeros(p.shape, dtype=state_dtype) for p in params] for _ in range(3)]
            rows = [list(r) for r in zip(params, grads, masters, *states, [torch.zeros(1) for _ in params])]
            k = kind(torch.bfloat16, master, state_dtype)
        inv = torch.tensor([0.5])  # held: a tensor made in the arguments is freed before the call
        for _ in range(2):
            sim.step("adam", 7, k, len(params), ptr_array(rows), numel_array(params),
                            (ctypes.c_double * 4)(0.9, 0.99, 1e-8, 0.01), (ctypes.c_int * 3)(1, 1, 0),
                            ctypes.c_double(1e-2), None, fptr(inv), None, 1, None,
                            ctypes.c_float(0), stochastic, ctypes.c_int64(9), 0)
        return [t for r in rows for t in r if t is not None]
    return run


def run_sgd_8bit(sim, gen):
    params, grads, masters = q8_lists(torch.bfloat16, True, gen, True)
    codes, absmax = codes_and_absmax(params, 1)
    rows = [list(r) for r in zip(params, grads, masters, codes[0], [torch.zeros(1) for _ in params], absmax)]
    for _ in range(2):
        sim.step("sgd", 5, q8_kind(torch.bfloat16, True), len(params), ptr_array(rows), numel_array(params),
                       (ctypes.c_double * 3)(0.9, 0.1, 1e-3), (ctypes.c_int * 2)(1, 0), ctypes.c_double(0.1), None,
                       None, None, 0, None, ctypes.c_float(0), 0, ctypes.c_int64(0), 0)
    return [t for r in rows for t in r]


def run_lion(sim, gen):
    params, grads, masters = optimizer_lists(torch.float16, True, gen, True)
    rows = [list(r) for r in zip(params, grads, masters, [torch.zeros(p.shape, dtype=torch.bfloat16) for p in params],
                                 [torch.zeros(1) for _ in params])]
    sim.step("lion", 5, kind(torch.float16, True, torch.bfloat16), len(params), ptr_array(rows), numel_array(params),
                    (ctypes.c_double * 3)(0.9, 0.99, 0.1), (ctypes.c_int * 1)(0), ctypes.c_double(1e-2), None, None, None,
                    0, None, ctypes.c_float(0), 1, ctypes.c_int64(5), 0)
    return [t for r in rows for t in r]


def run_muon_8bit(sim, gen):
    params, grads, _ = q8_lists(torch.bfloat16, False, gen, True)
    codes, absmax = codes_and_absmax(params, 1)
    updates = [torch.zeros(p.shape, dtype=torch.bfloat16) for p in params]
    rows = [[p, g, u, c, None, a] for p, g, c, u, a in zip(params, grads, codes[0], updates, absmax)]
    sim.step("muon_momentum", 5, q8_kind(torch.bfloat16), len(params), ptr_array(rows), numel_array(params),
             [0.95], [1], ctypes.c_double(0.0), None, None, None, 0, None, ctypes.c_float(0), 0, ctypes.c_int64(0), 0)
    return codes[0] + absmax + updates


KERNELS = {"unscale": run_unscale, "grad norm": run_grad_norm,
           "adam fp32 state": run_adam(torch.float32, True, 0), "adam bf16 state": run_adam(torch.bfloat16, "remainder", 1),
           "adam 8-bit": run_adam("8-bit", "remainder8", 2), "sgd 8-bit": run_sgd_8bit, "lion": run_lion,
           "muon 8-bit": run_muon_8bit}


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_every_schedule_gives_the_same_bits(emulation, kernel):
    """Threads in order, reversed, and in two random orders (which also switch threads at every
    shared-memory access), blocks likewise: bit for bit the same results, and no finding."""
    results = []
    for name, seed in (("in order", 0), ("reversed", 0), ("random", 1), ("random", 2)):
        emulation.set_schedule(name, seed)
        results.append(KERNELS[kernel](emulation, torch.Generator().manual_seed(21)))
    emulation.set_schedule("in order")
    for other in results[1:]:
        for i, (a, b) in enumerate(zip(results[0], other)):
            assert_bitwise_equal(a, b, f"output {i}")


# ---- the sizes a GPU runs -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real():
    return build_emulation("real")


REAL_CHUNK = 65536
# 130 small tensors pass the 4 KB plan's 120 tensors per launch (one list), and one of 321 chunks
# its 320 blocks; the others sit at a chunk's boundaries
REAL_SIZES = [0, 1, REAL_CHUNK - 1, REAL_CHUNK, REAL_CHUNK + 1, 2 * REAL_CHUNK + 4] + list(range(1, 131)) + [321 * REAL_CHUNK - 3]


@pytest.mark.parametrize("large", [0, 1])
def test_unscale_and_norm_at_the_real_sizes(real, large):
    gen = torch.Generator().manual_seed(31)
    tensors = [torch.randn(n, generator=gen).half() for n in REAL_SIZES]
    expected = [t.clone() for t in tensors]
    found, inv = torch.zeros(1), torch.tensor([0.25])
    before = real.fa_sim_launches()
    real.fa_sim_unscale(DTYPE_CODE[torch.float16], len(tensors), ptr_array([[t] for t in tensors]),
                        numel_array(tensors), fptr(found), fptr(inv), large)
    # the 4 KB plan flushes on tensors and on blocks; all of it fits one launch of the 32 KB plan
    assert real.fa_sim_launches() - before == (1 if large else 3)
    torch._amp_foreach_non_finite_check_and_unscale_(expected, torch.zeros(1), inv)
    for i, (a, b) in enumerate(zip(tensors, expected)):
        assert_bitwise_equal(a, b, f"tensor {i}")
    real.fa_sim_norm_chunks.restype = ctypes.c_int64
    partials = torch.zeros(sum(real.fa_sim_norm_chunks(ctypes.c_int64(t.numel())) for t in tensors) + 1,
                           dtype=torch.float64)
    norm = torch.zeros(1)
    real.fa_sim_grad_norm(DTYPE_CODE[torch.float16], len(tensors), ptr_array([[t] for t in tensors]),
                          numel_array(tensors), fptr(partials), fptr(found), None, NORM_KIND[2.0], fptr(norm), large)
    exact = torch.linalg.vector_norm(torch.cat([t.double() for t in tensors]))
    torch_error = max((torch.nn.utils.get_total_norm([t.float() for t in tensors if t.numel()], 2.0,
                                                     foreach=f).double() - exact).abs().item() for f in (True, False))
    assert (norm.double() - exact).abs().item() <= max(torch_error, torch.finfo(torch.float32).eps * exact.item())
    assert found.item() == 0.0


@pytest.mark.parametrize("large", [0, 1])
def test_adam_with_8bit_state_at_the_real_sizes(real, large):
    """Chunks of 65536 (32 tiles of 2048 elements), bit for bit the CPU op."""
    sizes = [0, 1, REAL_CHUNK - 1, REAL_CHUNK, REAL_CHUNK + 1, 2 * REAL_CHUNK + 300, 300]
    gen = torch.Generator().manual_seed(32)
    params = [torch.randn(n, generator=gen).bfloat16() for n in sizes]
    grads = [torch.randn(n, generator=gen).bfloat16() for n in sizes]
    masters = [torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8) for n in sizes]
    codes, absmax = codes_and_absmax(params, 2)
    steps = [torch.zeros(1) for _ in params]
    ref = [[t.clone() for t in ts] for ts in (params, grads, masters, *codes, absmax, steps)]
    inv = torch.tensor([0.5])
    for _ in range(2):
        rows = [list(r) for r in zip(params, grads, masters, *codes, [None] * len(params), steps, absmax)]
        real.step("adam", 7, q8_kind(torch.bfloat16, "remainder8"), len(params), ptr_array(rows), numel_array(params),
                         (ctypes.c_double * 4)(0.9, 0.99, 1e-8, 0.01), (ctypes.c_int * 3)(1, 0, 0),
                         ctypes.c_double(1e-2), None, fptr(inv), None, 1, None, ctypes.c_float(0), 2,
                         ctypes.c_int64(17), large)
        adam_step_(ref[0], ref[1], ref[2], ref[3], ref[4], [], ref[6], state_absmaxes=ref[5], lr=1e-2,
                       beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.01, amsgrad=False, maximize=False,
                       decoupled_weight_decay=True, inv_scale=inv, rounding_seed=17, stochastic_codes=True)
    for i in range(len(params)):
        for k in range(2):
            assert_codes_match(codes[k][i], ref[3 + k][i], absmax[i][k], ref[5][i][k], f"tensor {i} state {k}")
        for name, a, b in (("param", params, ref[0]), ("grad", grads, ref[1]), ("master", masters, ref[2])):
            assert_bitwise_equal(a[i], b[i], f"{name} {i}")


@pytest.mark.parametrize("length", [1, 3])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("reduction", [False, True])
def test_delayed_scaling_matches_the_cpu_op(sim, length, algo, reduction):
    """fp8 delayed scaling (amp.cu) against the CPU op, bit for bit: more tensors than a launch
    takes, a tensor's scales over several blocks, every kind of amax (test_delayed_scaling.py's)."""
    from test_delayed_scaling import cases
    gen = torch.Generator().manual_seed(9)
    columns = [7, 0, 2 * CHUNK + 5, 1, 12]
    histories, scales = cases(gen, length, columns)
    reduced = None
    if reduction:
        reduced = torch.rand(sum(columns), generator=gen)
        reduced[::3] = 0.0
    ref = [[t.clone() for t in ts] for ts in (histories, scales)]
    ref_invs = [torch.zeros_like(s) for s in scales]
    invs = [torch.zeros_like(s) for s in scales]
    slices = reduced.split(columns) if reduction else [None] * len(columns)
    for _ in range(2):
        sim.fa_sim_delayed_scale_update(len(columns), ptr_array([[h, s, i, r] for h, s, i, r in
                                                                 zip(histories, scales, invs, slices)]),
                                        numel_array(scales), ctypes.c_int64(length), ctypes.c_float(448.0 / 2),
                                        int(algo == "most_recent"))
        ops.delayed_scale_update_(ref[0], ref[1], ref_invs, fp8_max=448.0, margin=1.0, amax_compute_algo=algo,
                                  amax_reduction_buffer=reduced)
    for got, want in zip(histories + scales + invs, ref[0] + ref[1] + ref_invs):
        assert_bitwise_equal(got, want)
