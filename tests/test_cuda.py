"""What only a GPU can settle (make gpu-check runs these): the CUDA kernels bitwise against the
CPU kernels, unscale_ against torch's CUDA kernel across both launch plans and at the edges of
the plan, a whole training step without host syncs, captured in a CUDA graph, and grads on a
second device. All skip without a GPU."""
import math

import pytest
import torch

import fused_amp
from fused_amp import ops
from helpers import assert_bitwise_equal, adam_step_
from optim_registry import CASES, IDS, OPTIMIZERS, PARAM_DTYPES, torch_impls

pytestmark = pytest.mark.cuda


# ---- optimizer kernels: CUDA against CPU ------------------------------------------------------

SHAPES = [(1000, 33), (65537,), (7,), (0,), (3, 5, 9)]


def run_optimizer(cls, kw, dtype, master_weights, device, steps=5, **options):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(device, dtype)) for s in SHAPES]
    opt = cls(params, master_weights=master_weights, **kw, **options)
    for step in range(steps + 1):
        for p in params:
            p.grad = (torch.randn(p.shape, generator=gen) * 256).to(device, dtype)
        overflow = step == 2  # one skipped step in the middle
        opt.grad_scale = torch.full((), 256.0, device=device)
        opt.found_inf = torch.full((), float(overflow), device=device)
        opt.step()
        del opt.grad_scale, opt.found_inf
    out = []
    for p in params:
        out += [p.detach(), p.grad] + [v for _, v in sorted(opt.state[p].items())]
    return [t.cpu() for t in out]


def pow_agrees(betas, steps=5):
    """Whether CUDA's and the CPU's double pow agree on the bias corrections these steps need."""
    t = torch.arange(1, steps + 1, dtype=torch.float64)
    for beta in betas:
        cpu = torch.full_like(t, beta).pow(t)
        gpu = torch.full_like(t, beta, device="cuda").pow(t.cuda()).cpu()
        if not torch.equal(cpu, gpu):
            return False
    return True


@pytest.mark.parametrize("master_weights", [True, False])
@pytest.mark.parametrize("dtype", PARAM_DTYPES)
@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_optimizer_cuda_bitwise_equal_to_cpu(cls, torch_cls, kw, dtype, master_weights):
    """The shared math (csrc/ops) is compiled without contraction on both sides, with the same
    explicit FMAs: params, masters, state and the unscaled grads must agree bit for bit. The
    step-dependent coefficients use double pow (libm on the CPU, CUDA's on the GPU); sqrt and
    division are IEEE on both. If this fails, the message says whether pow is the cause."""
    cpu = run_optimizer(cls, kw, dtype, master_weights, "cpu")
    gpu = run_optimizer(cls, kw, dtype, master_weights, "cuda")
    for i, (a, b) in enumerate(zip(gpu, cpu)):
        if not torch.equal(torch.isnan(a), torch.isnan(b)) or not torch.equal(
                a.nan_to_num(), b.nan_to_num()):
            if cls is fused_amp.optim.SGD:
                cause = "SGD uses no pow: the element-wise math differs"
            elif pow_agrees(kw.get("betas", (0.9, 0.999))):
                cause = "double pow agrees: the element-wise math differs"
            else:
                cause = "double pow differs between CUDA and the CPU for these betas"
            diff = (a.double() - b.double()).abs().max().item()
            pytest.fail(f"tensor {i} differs (max abs diff {diff:g}); {cause}")


MEMORY_MODES = {"remainder": dict(master_weights="remainder"),
                "bf16-state": dict(master_weights=True, state_dtype=torch.bfloat16),
                "remainder-bf16-state-sr": dict(master_weights="remainder", state_dtype=torch.bfloat16,
                                                stochastic_rounding=True, rounding_seed=11),
                "24-bit": dict(master_weights="remainder8", stochastic_rounding=False),
                "24-bit-sr-bf16-state": dict(master_weights="remainder8", state_dtype=torch.bfloat16,
                                             rounding_seed=11),
                # 8-bit codes on every param but the 7-element one (min_8bit_size): the tiles of
                # whole quant blocks (cuda/step_states.cuh) over chunk and tile boundaries
                "8-bit-state": dict(master_weights=True, state_dtype=torch.uint8, min_8bit_size=8),
                "remainder-8-bit-state": dict(master_weights="remainder", state_dtype=torch.uint8, min_8bit_size=8),
                "24-bit-sr-8-bit-state": dict(master_weights="remainder8", state_dtype=torch.uint8,
                                              rounding_seed=11, min_8bit_size=8),
                "8-bit-state-sr": dict(master_weights=True, state_dtype=torch.uint8, stochastic_rounding=True,
                                       rounding_seed=11, min_8bit_size=8),
                # 4-bit codes (cuda/step_states.cuh's Codes4): two per byte, blocks of 128
                "4-bit-state": dict(master_weights=True, state_dtype=torch.uint4, min_8bit_size=8),
                "24-bit-sr-4-bit-state": dict(master_weights="remainder8", state_dtype=torch.uint4,
                                              rounding_seed=11, min_8bit_size=8)}


@pytest.mark.parametrize("mode", list(MEMORY_MODES))
@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_memory_modes_cuda_bitwise_equal_to_cpu(cls, torch_cls, kw, mode):
    """bf16 params in each memory mode: the remainder split and the stochastic rounding's bits
    are integer work on both sides, the math as above: everything agrees bit for bit."""
    options = dict(MEMORY_MODES[mode])
    master_weights = options.pop("master_weights")
    cpu = run_optimizer(cls, kw, torch.bfloat16, master_weights, "cpu", **options)
    gpu = run_optimizer(cls, kw, torch.bfloat16, master_weights, "cuda", **options)
    for i, (a, b) in enumerate(zip(gpu, cpu)):
        assert_bitwise_equal(a, b, f"tensor {i}")


# ---- unscale_ and non_finite_check_ against torch's CUDA kernel ------------------------------

def edge_list(gen):
    """Every edge of the launch plan: empty tensors, sizes around the 65,536-element chunk,
    more tensors than either plan holds (110/770 for one list), more blocks than either holds
    (320/2240), unaligned starts (views at offset 1), and the three half and float dtypes."""
    sizes = [0, 1, 65535, 65536, 65537, 0, 131073] + [333] * 900 + [150_000_000]
    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    out = []
    for i, n in enumerate(sizes):
        dtype = dtypes[i % 3]
        if i % 5 == 1 and n > 0:  # one element past an aligned start
            base = (torch.randn(n + 1, generator=gen) * 1000).to("cuda", dtype)
            out.append(base[1:])
        else:
            out.append((torch.randn(n, generator=gen) * 1000).to("cuda", dtype))
    return out


@pytest.fixture(params=[4096, 32768], ids=["4KB-plan", "32KB-plan"])
def launch_plan(request):
    fused_amp._C._set_kernel_arg_bytes(request.param)
    yield request.param
    fused_amp._C._set_kernel_arg_bytes(0)


@pytest.mark.parametrize("inv_scale", [0.5, 2.0 ** -16, 0.1])
def test_unscale_bitwise_equal_to_torch_at_every_edge(launch_plan, inv_scale):
    gen = torch.Generator().manual_seed(3)
    ours = edge_list(gen)
    theirs = [t.clone() for t in ours]
    found_ours, found_theirs = torch.zeros(1, device="cuda"), torch.zeros(1, device="cuda")
    inv = torch.full((1,), inv_scale, device="cuda")
    ops.unscale_(ours, found_ours, inv)
    torch._amp_foreach_non_finite_check_and_unscale_(theirs, found_theirs, inv)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert_bitwise_equal(a, b, f"tensor {i}")
    assert found_ours.item() == found_theirs.item() == 0.0
    for where in (-1, 7, -900):  # an inf in the huge tensor's last element, and elsewhere
        t = ours[where]
        t[-1] = float("inf")
        found = torch.zeros(1, device="cuda")
        ops.non_finite_check_(ours, found)
        assert found.item() == 1.0, where
        t[-1] = 0.0


def test_unscale_beyond_2_31_elements():
    """64-bit offsets: a bf16 tensor of more than 2^31 elements (4 GiB)."""
    n = 2 ** 31 + 4097
    x = torch.full((n,), 3.0, dtype=torch.bfloat16, device="cuda")
    x[-1] = 5.0
    found = torch.zeros(1, device="cuda")
    ops.unscale_([x], found, torch.full((1,), 0.5, device="cuda"))
    assert found.item() == 0.0
    assert x[-1].item() == 2.5 and x[0].item() == 1.5 and x[2 ** 31].item() == 1.5
    assert bool((x[:-1] == 1.5).all())
    x[-2] = float("nan")
    ops.non_finite_check_([x], found)
    assert found.item() == 1.0


# ---- the grad norm and the clipped step ----------------------------------------------------

@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_grad_norm_cuda_is_as_close_to_the_exact_norm_as_torch_and_deterministic(dtype, norm_type):
    gen = torch.Generator().manual_seed(0)
    grads = [(torch.randn(n, generator=gen) * 3).to(dtype) for n in (1, 1000, 65536, 65537, 3_000_001)]
    grads.append(torch.randn(64, 64, generator=gen).to(dtype).t())  # staged: not dense in order
    inv = torch.tensor(2.0 ** -7, device="cuda")
    runs = []
    for _ in range(3):
        found = torch.zeros((), device="cuda")
        norm = torch.empty((), device="cuda")
        ops.grad_norm_([g.cuda() for g in grads], found, norm, inv, norm_type)
        runs.append((norm.cpu(), found.item()))
    unscaled = [g.double().flatten() * 2.0 ** -7 for g in grads]
    exact = torch.linalg.vector_norm(torch.cat(unscaled), norm_type)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    torch_error = max((torch.nn.utils.get_total_norm([u.to(work).cuda() for u in unscaled], norm_type,
                                                     foreach=f).double().cpu() - exact).abs().item()
                      for f in (True, False))
    norm, found = runs[0]
    assert (norm.double() - exact).abs().item() <= max(torch_error, torch.finfo(torch.float32).eps * exact.item())
    assert found == 0.0
    for other, _ in runs[1:]:
        assert_bitwise_equal(other, norm)


@pytest.mark.parametrize("max_norm", [0.5, 1e9])
@pytest.mark.parametrize("dtype", PARAM_DTYPES)
def test_clipped_adam_step_cuda_bitwise_equal_to_cpu(dtype, max_norm):
    """Given the same norm, the clip coefficient and the step agree bit for bit."""
    out = []
    for device in ("cpu", "cuda"):
        gen = torch.Generator().manual_seed(0)
        params = [torch.randn(s, generator=gen).to(device, dtype) for s in SHAPES]
        grads = [(torch.randn(s, generator=gen) * 256).to(device, dtype) for s in SHAPES]
        masters = [p.float() if dtype != torch.float32 else None for p in params]
        m, v = ([torch.zeros(s, device=device) for s in SHAPES] for _ in range(2))
        steps = [torch.zeros((), device=device) for _ in SHAPES]
        adam_step_(params, grads, masters, m, v, [], steps, lr=1e-3, beta1=0.9, beta2=0.999,
                       eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False,
                       decoupled_weight_decay=True, inv_scale=torch.full((), 1 / 256, device=device),
                       grad_norm=torch.full((), 3.25, device=device), max_grad_norm=max_norm)
        out.append([t.cpu() for t in params + grads + m + v])
    for a, b in zip(*out):
        assert_bitwise_equal(b, a)


# ---- a whole training step: no host sync, CUDA graph capture ------------------------------

def optimizer_factories():
    """Our optimizers on fp16 params (plain, then clipping every step), on bf16 params with both
    memory modes and stochastic rounding (whose random bits follow the step count on the device,
    so a replay rounds as the eager step does), 24-bit masters, 24-bit masters with 8-bit state,
    and torch's fused ones on fp32 params (where torch has the optimizer), each with our scaler."""
    out = [(e.ours.__name__, torch.float16, lambda ps, e=e: e.ours(ps, **e.options[-1])) for e in OPTIMIZERS]
    out += [(f"{e.ours.__name__}-max_grad_norm", torch.float16,
             lambda ps, e=e: e.ours(ps, max_grad_norm=0.05, **e.options[-1])) for e in OPTIMIZERS]
    out += [(f"{e.ours.__name__}-remainder-bf16-state-sr", torch.bfloat16,
             lambda ps, e=e: e.ours(ps, master_weights="remainder", state_dtype=torch.bfloat16,
                                    stochastic_rounding=True, rounding_seed=5, **e.options[-1]))
            for e in OPTIMIZERS]
    out += [(f"{e.ours.__name__}-24-bit", torch.bfloat16,
             lambda ps, e=e: e.ours(ps, master_weights="remainder8", rounding_seed=5, **e.options[-1]))
            for e in OPTIMIZERS]
    out += [(f"{e.ours.__name__}-24-bit-8-bit-state", torch.bfloat16,
             lambda ps, e=e: e.ours(ps, master_weights="remainder8", state_dtype=torch.uint8, min_8bit_size=0,
                                    rounding_seed=5, **e.options[-1]))
            for e in OPTIMIZERS]
    out += [(f"torch-{e.theirs.__name__}-fused", torch.float32,
             lambda ps, e=e: e.theirs(ps, fused=True, **e.options[-1]))
            for e in OPTIMIZERS  # torch's fused ones, not the test references
            if e.theirs.__module__.startswith("torch.") and torch_impls(e.theirs)[0] == dict(fused=True)]
    return out


FACTORIES = optimizer_factories()


def setup(dtype, make_opt):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 8)).cuda().to(dtype)
    opt = make_opt(list(model.parameters()))
    scaler = fused_amp.GradScaler("cuda", init_scale=2.0 ** 12)
    x = torch.randn(32, 64, device="cuda", dtype=dtype)
    return model, opt, scaler, x


def train_step(model, opt, scaler, x):
    opt.zero_grad(set_to_none=False)
    scaler.scale(model(x).float().pow(2).mean()).backward()
    scaler.step(opt)
    scaler.update()


def assert_no_host_sync(model, opt, scaler, x):
    train_step(model, opt, scaler, x)  # state is created on the first step
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            train_step(model, opt, scaler, x)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def assert_replays_equal_eager(make):
    """A training step captured in a CUDA graph and replayed, against the same steps run eagerly
    on a twin (``make()``: model, optimizer, scaler, input), through an overflow."""
    model, opt, scaler, x = make()
    ref_model, ref_opt, ref_scaler, _ = make()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            train_step(model, opt, scaler, x)
            train_step(ref_model, ref_opt, ref_scaler, x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        train_step(model, opt, scaler, x)
    clean = x.clone()
    for i in range(6):
        x.copy_(clean)
        if i == 3:  # an overflow inside the replays: both skip, both back off
            x[0, 0] = float("inf")
        graph.replay()
        train_step(ref_model, ref_opt, ref_scaler, x)
    torch.cuda.synchronize()
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert_bitwise_equal(a.detach(), b.detach())
    for p, q in zip(model.parameters(), ref_model.parameters()):
        for key, v in opt.state[p].items():
            assert_bitwise_equal(v, ref_opt.state[q][key], key)
    assert scaler._scale.item() == ref_scaler._scale.item()


@pytest.mark.parametrize("name,dtype,make_opt", FACTORIES, ids=[f[0] for f in FACTORIES])
def test_training_step_has_no_host_sync(name, dtype, make_opt):
    assert_no_host_sync(*setup(dtype, make_opt))


CAPTURED = FACTORIES[:3 * len(OPTIMIZERS)] + [f for f in FACTORIES if f[0].endswith("-8-bit-state")]


@pytest.mark.parametrize("name,dtype,make_opt", CAPTURED, ids=[f[0] for f in CAPTURED])
def test_training_step_captured_in_a_cuda_graph_equals_eager(name, dtype, make_opt):
    assert_replays_equal_eager(lambda: setup(dtype, make_opt))


# ---- several devices ------------------------------------------------------------------------

def test_grads_on_a_second_device():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(100, generator=gen).to(f"cuda:{i % 2}", torch.bfloat16))
              for i in range(4)]
    twins = [torch.nn.Parameter(p.detach().cpu()) for p in params]
    opt, twin_opt = fused_amp.optim.AdamW(params, lr=1e-2), fused_amp.optim.AdamW(twins, lr=1e-2)
    for step in range(3):
        for p, t in zip(params, twins):
            t.grad = (torch.randn(100, generator=gen) * 64).bfloat16()
            p.grad = t.grad.to(p.device)
        if step == 1:
            params[1].grad[0] = float("inf")
            twins[1].grad[0] = float("inf")
        for o, ps, dev in ((opt, params, "cuda"), (twin_opt, twins, "cpu")):
            scaler = fused_amp.GradScaler(dev, init_scale=64.0)
            scaler.scale(torch.ones((), device=ps[0].device))
            scaler.step(o)
            scaler.update()
    for p, t in zip(params, twins):
        assert_bitwise_equal(p.detach().cpu(), t.detach())
        assert_bitwise_equal(opt.state[p]["master_param"].cpu(), twin_opt.state[t]["master_param"])


# ---- Muon: the momentum kernel, its Newton-Schulz on the GPU, a captured step ----------------

def test_muon_momentum_cuda_bitwise_equal_to_cpu():
    gen = torch.Generator().manual_seed(0)
    for dtype, state_dtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                               (torch.float16, torch.bfloat16), (torch.bfloat16, torch.uint8)):
        shapes = [(1000, 33), (65537, 1), (7, 3)]
        states = ([torch.zeros(s, dtype=torch.uint8) for s in shapes] if state_dtype == torch.uint8
                  else [torch.randn(s, generator=gen).to(state_dtype) for s in shapes])
        lists = [[torch.randn(s, generator=gen).to(dtype) for s in shapes],
                 [(torch.randn(s, generator=gen) * 256).to(dtype) for s in shapes], states,
                 [torch.zeros(s, dtype=torch.bfloat16) for s in shapes]]
        # 8-bit codes: one absmax row per param (from zero codes: the first step quantizes the grads)
        absmaxes = ([torch.zeros(1, (math.prod(s) + 255) // 256) for s in shapes]
                    if state_dtype == torch.uint8 else None)
        on_gpu = [[t.cuda() for t in ts] for ts in lists]
        gpu_absmaxes = [a.cuda() for a in absmaxes] if absmaxes else None
        for nesterov in (True, False):
            for args, a, device in ((lists, absmaxes, "cpu"), (on_gpu, gpu_absmaxes, "cuda")):
                params, grads, bufs, updates = args
                ops.step_("muon_momentum", params, grads, [], [bufs], [], outputs=updates, state_absmaxes=a,
                          hyper=dict(momentum=0.95, nesterov=nesterov), lr=0.0,
                          inv_scale=torch.full((), 1 / 256, device=device),
                          grad_norm=torch.full((), 50.0, device=device), max_grad_norm=10.0)
        for cpu, gpu in zip(sum(lists[1:], []) + (absmaxes or []), sum(on_gpu[1:], []) + (gpu_absmaxes or [])):
            assert_bitwise_equal(gpu.cpu(), cpu)


def test_muon_cuda_steps_as_torchs_muon_within_its_reordering_spread():
    """Newton-Schulz as bf16 Tensor Core products: ours (bf16 params, fp32 masters) against
    torch's Muon on fp32 copies on the GPU, within the spread of torch's Muon with its sums
    reordered (tests/test_muon.py's variants, run on the GPU)."""
    from test_muon import max_distance, run_ours, torch_spread, values

    gen = torch.Generator().manual_seed(1)
    shapes = [(256, 1024), (1024, 256), (256, 1024), (512, 512)]
    init = [torch.randn(s, generator=gen).bfloat16().cuda() for s in shapes]
    grads = [[torch.randn(s, generator=gen).bfloat16().cuda() for s in shapes] for _ in range(6)]
    reference, spread = torch_spread(init, grads, dict(lr=0.02))
    params, opt = run_ours(init, grads)
    assert max_distance(values(opt, params), reference) <= spread


def muon_setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.GELU(),
                                torch.nn.Linear(128, 64, bias=False)).cuda().bfloat16()
    opt = fused_amp.optim.Muon(model.parameters(), lr=0.02, max_grad_norm=1.0)
    scaler = fused_amp.GradScaler("cuda", init_scale=2.0 ** 12)
    x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)
    return model, opt, scaler, x


def test_muon_training_step_has_no_host_sync_and_replays_in_a_cuda_graph():
    assert_no_host_sync(*muon_setup())
    assert_replays_equal_eager(muon_setup)


def test_delayed_scaling_replays_in_a_cuda_graph_bitwise_as_the_cpu_op():
    """fp8 delayed scaling syncs nothing with the host: captured once, replayed three times, it
    gives the bits of three CPU updates."""
    from test_delayed_scaling import cases
    histories, scales = cases(torch.Generator().manual_seed(3), 8, [5, 300])
    cpu = [[t.clone() for t in ts] for ts in (histories, scales)]
    cpu_invs = [torch.zeros_like(s) for s in scales]
    dev = [[t.cuda() for t in ts] for ts in (histories, scales)]
    invs = [torch.zeros_like(s) for s in dev[1]]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.delayed_scale_update_(dev[0], dev[1], invs, fp8_max=448.0, margin=1.0)
    for _ in range(3):
        graph.replay()
        ops.delayed_scale_update_(cpu[0], cpu[1], cpu_invs, fp8_max=448.0, margin=1.0)
    torch.cuda.synchronize()
    for got, want in zip(dev[0] + dev[1] + invs, cpu[0] + cpu[1] + cpu_invs):
        assert_bitwise_equal(got.cpu(), want)
