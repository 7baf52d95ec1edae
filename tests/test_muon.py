"""Muon against torch.optim.Muon: its signature, checks and messages; its update on fp32 copies
fed the same unscaled grads, within the spread of torch's own Muon when its Newton-Schulz runs
in another, equivalent order; the scaler, clipping, memory modes, checkpoints both ways, the
Muon + AdamW recipe with one scaler, and DDP.

Muon only takes 2-D params, so it is not in optim_registry (whose generic tests use 1-D and 4-D
params too); what those tests check for every optimizer is checked here for Muon."""
import copy
import inspect
import pickle

import pytest
import torch
import torch.optim._muon as torch_muon

import fused_amp
from fused_amp import ops
from fused_amp.optim import AdamW, Muon
from fused_amp.optim._newton_schulz import orthogonalize
from helpers import assert_bitwise_equal, assert_our_keywords, bf16_ties_away
from test_distributed import run_ranks

# wide, tall (of the same size: another stack), square, two of a shape (batched together)
SHAPES = [(64, 256), (256, 64), (64, 256), (96, 96), (32, 48)]
OPTIONS = [dict(lr=0.02),
           dict(lr=0.02, nesterov=False, adjust_lr_fn="match_rms_adamw"),
           dict(lr=0.02, weight_decay=0.0, momentum=0.9, adjust_lr_fn="spectral_unclamped")]
COEFFICIENTS = torch_muon.DEFAULT_A, torch_muon.DEFAULT_B, torch_muon.DEFAULT_C


# ---- torch's Newton-Schulz in other, equivalent orders: the spread the tolerance comes from ----

def _other_orientation(grad, ns_coefficients, ns_steps, eps):
    """torch's iteration on the other orientation of the matrix: X = a X + X B with A = X^T X
    on the tall form (the same polynomial, other sums)."""
    a, b, c = ns_coefficients
    x = grad.bfloat16()
    wide = grad.size(0) <= grad.size(1)
    if wide:
        x = x.T
    x = x.div(x.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram = x.T @ x
        x = torch.addmm(x, x, torch.addmm(gram, gram, gram, beta=b, alpha=c), beta=a)
    return x.T if wide else x


def _fp32_sums(grad, ns_coefficients, ns_steps, eps, transpose_tall=True):
    """torch's iteration with each product summed in fp32 from the bf16 values and rounded to
    bf16 once (a bf16 GEMM's contract, summed in another order); with ``transpose_tall=False``
    a tall matrix iterates on its own orientation, X = a X + X B with A = X^T X (both orders at
    once)."""
    a, b, c = ns_coefficients
    x = grad.bfloat16()
    transposed = transpose_tall and grad.size(0) > grad.size(1)
    tall = grad.size(0) > grad.size(1) and not transposed
    if transposed:
        x = x.T
    x = x.div(x.norm().clamp(min=eps))

    def bf16(t):
        return t.bfloat16().float()

    x = x.float()
    for _ in range(ns_steps):
        gram = bf16(x.T @ x if tall else x @ x.T)
        poly = bf16(torch.addmm(gram, gram, gram, beta=b, alpha=c))
        x = bf16(torch.addmm(x, x, poly, beta=a) if tall else torch.addmm(x, poly, x, beta=a))
    x = x.bfloat16()
    return x.T if transposed else x


def _both_orders(grad, ns_coefficients, ns_steps, eps):
    return _fp32_sums(grad, ns_coefficients, ns_steps, eps, transpose_tall=False)


# torch's Newton-Schulz summed in other orders. Ours also sums in batched products, an order
# none of these has, so that no one of them bounds its distance from torch: on a Xeon with bf16
# matrix instructions (AMX), where the other orientation changes nothing, ours landed up to 37%
# past the fp32 sums' distance. The allowance is the sum of all three distances.
REORDERINGS = (_other_orientation, _fp32_sums, _both_orders)


def torch_run(init, grads, kw, ns=None, make=torch.optim.Muon):
    params = [torch.nn.Parameter(x.float().clone()) for x in init]
    opt = make(params, **kw)
    original = torch_muon._zeropower_via_newtonschulz
    torch_muon._zeropower_via_newtonschulz = ns or original
    try:
        for step_grads in grads:
            for p, g in zip(params, step_grads):
                p.grad = g.float().clone()
            opt.step()
    finally:
        torch_muon._zeropower_via_newtonschulz = original
    return params, opt


def run_ours(init, grads, lr=0.02, before_step=None, **kw):
    """Our Muon on copies of ``init`` fed ``grads``; ``before_step(opt)`` runs before each step."""
    params = [torch.nn.Parameter(x.clone()) for x in init]
    opt = Muon(params, lr=lr, **kw)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        if before_step is not None:
            before_step(opt)
        opt.step()
    return params, opt


def data(dtype, steps=8, seed=0, shapes=SHAPES):
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    grads = [[torch.randn(s, generator=gen).to(dtype) for s in shapes] for _ in range(steps)]
    return init, grads


def max_distance(a, b):
    return max((x.detach().float() - y.detach().float()).abs().max().item() for x, y in zip(a, b))


def torch_spread(init, grads, kw, make=torch.optim.Muon):
    """How far torch's Muon (``make``) moves when only the order of its Newton-Schulz sums
    changes: ours reorders in both ways (tall matrices iterate on their own orientation; on the
    CPU the products are fp32 sums of the bf16 values), so its distance may be the sum of the
    reorderings'."""
    reference, _ = torch_run(init, grads, kw, make=make)
    spread = sum(max_distance(reference, torch_run(init, grads, kw, ns, make)[0]) for ns in REORDERINGS)
    return reference, spread


def values(opt, params):
    return [opt.state[p]["master_param"] if p.dtype != torch.float32 else p.detach() for p in params]


# ---- the update ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kw", OPTIONS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_steps_as_torch_within_its_reordering_spread(dtype, kw):
    """fp32 params: the params; half params: the fp32 masters, against torch's Muon on fp32
    copies fed the same grads."""
    init, grads = data(dtype)
    reference, spread = torch_spread(init, grads, kw)
    params, opt = run_ours(init, grads, **kw)
    assert 0 < spread < 1e-2
    assert max_distance(values(opt, params), reference) <= spread
    for p in params:  # the momentum is torch's exactly: the same lerps in fp32
        if dtype == torch.float32:
            continue
        assert opt.state[p]["master_param"].to(dtype).equal(p.detach())


def test_options_changed_between_steps_apply_though_the_lists_stay_cached():
    """The stacks and the params of each shape are kept with the cached lists; the lr ratio
    (adjust_lr_fn) and the lr are read from the group at every step, as torch's Muon reads them:
    bitwise the run whose lists are rebuilt before every step."""
    init, grads = data(torch.bfloat16)

    def switching(rebuild):
        def before_step(opt):
            if rebuild:
                opt._lists.forget()
            opt.steps_taken = getattr(opt, "steps_taken", 0) + 1
            if opt.steps_taken == 4:
                opt.param_groups[0].update(adjust_lr_fn="match_rms_adamw", lr=0.01)
        return before_step

    params, opt = run_ours(init, grads, before_step=switching(rebuild=False))
    rebuilt, rebuilt_opt = run_ours(init, grads, before_step=switching(rebuild=True))
    for a, b in zip(values(opt, params), values(rebuilt_opt, rebuilt)):
        assert_bitwise_equal(a, b)
    unswitched, unswitched_opt = run_ours(init, grads)
    assert max_distance(values(opt, params), values(unswitched_opt, unswitched)) > 0


def test_momentum_is_torchs_bitwise():
    init, grads = data(torch.float32)
    reference, ref_opt = torch_run(init, grads, dict(lr=0.02))
    params, opt = run_ours(init, grads)
    for p, q in zip(params, reference):
        assert_bitwise_equal(opt.state[p]["momentum_buffer"], ref_opt.state[q]["momentum_buffer"])


def test_batched_newton_schulz_is_torchs_per_matrix_within_its_reordering_spread():
    gen = torch.Generator().manual_seed(3)
    for shape in [(64, 256), (256, 64), (96, 96)]:
        stack = torch.randn((4,) + shape, generator=gen).bfloat16()
        ours = orthogonalize(stack, COEFFICIENTS, 5, 1e-7)
        for i in range(4):
            theirs = torch_muon._zeropower_via_newtonschulz(stack[i], COEFFICIENTS, 5, 1e-7)
            spread = sum((theirs.float() - ns(stack[i], COEFFICIENTS, 5, 1e-7).float()).abs().max().item()
                         for ns in REORDERINGS)
            assert (ours[i].float() - theirs.float()).abs().max().item() <= spread, shape


def test_a_zero_update_stays_zero():
    """The norm's floor eps: a zero momentum gives a zero update (no NaN), as torch."""
    p = torch.nn.Parameter(torch.ones(8, 16))
    opt = Muon([p], lr=0.1, weight_decay=0.0)
    p.grad = torch.zeros_like(p)
    opt.step()
    assert_bitwise_equal(p.detach(), torch.ones(8, 16))


# ---- the fused momentum pass (ops.step_("muon_momentum")) ----------------------------------------

def momentum_pass(params, grads, bufs, updates, momentum=0.9, nesterov=True, **kw):
    ops.step_("muon_momentum", params, grads, [], [bufs], [], outputs=updates,
              hyper=dict(momentum=momentum, nesterov=nesterov), lr=0.0, **kw)


@pytest.mark.parametrize("dtype,state_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                               (torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16)])
@pytest.mark.parametrize("momentum", [0.95, 0.3])  # 1 - momentum on either side of lerp's 0.5
@pytest.mark.parametrize("nesterov", [True, False])
def test_momentum_pass_is_torchs_lerps_bitwise(dtype, state_dtype, momentum, nesterov):
    """torch.optim.Muon's lerp_ and lerp written with torch's ops, on vector bodies and tails:
    the fused pass gives their bits (momentum, bf16 update, unscaled grad); bf16 momentum is
    stepped in fp32 and stored rounded, as every state_dtype=torch.bfloat16 of ours."""
    gen = torch.Generator().manual_seed(2)
    shapes = [(3, 37), (64, 256), (1, 5)]
    grads = [(torch.randn(s, generator=gen) * 8).to(dtype) for s in shapes]
    bufs = [torch.randn(s, generator=gen).to(state_dtype) for s in shapes]
    params = [torch.zeros(s, dtype=dtype) for s in shapes]
    updates = [torch.empty(s, dtype=torch.bfloat16) for s in shapes]
    inv = torch.tensor(0.125)
    expected = []
    for g, b in zip(grads, bufs):
        unscaled = (g.float() * inv).to(dtype)
        g32 = g.float() * inv  # the pass steps with the fp32 value, as torch's fused steps do
        # the math in fp32, the momentum stored in its dtype (bf16: rounded to nearest even)
        ref_b = b.float().lerp(g32, 1 - momentum)
        ref_u = (g32.lerp(ref_b, momentum) if nesterov else ref_b).bfloat16()
        expected.append((unscaled, ref_b.to(state_dtype), ref_u))
    momentum_pass(params, grads, bufs, updates, momentum=momentum, nesterov=nesterov, inv_scale=inv)
    for g, b, u, (eg, eb, eu) in zip(grads, bufs, updates, expected):
        assert_bitwise_equal(g, eg)
        assert_bitwise_equal(b, eb)
        assert_bitwise_equal(u, eu)
    assert all(not p.any() for p in params)  # read for their shapes only


def test_momentum_pass_writes_nothing_on_overflow_and_refuses_bad_outputs_first():
    p, g, b = torch.zeros(4, 8), torch.randn(4, 8), torch.randn(4, 8)
    u = torch.zeros(4, 8, dtype=torch.bfloat16)
    before = [t.clone() for t in (p, g, b, u)]
    momentum_pass([p], [g], [b], [u], inv_scale=torch.tensor(0.5), found_inf=torch.tensor(1.0))
    for t, e in zip((p, g, b, u), before):
        assert_bitwise_equal(t, e)
    with pytest.raises(TypeError, match=r"outputs\[0\] has dtype Float, expected BFloat16"):
        momentum_pass([p], [g], [b], [torch.zeros(4, 8)], inv_scale=torch.tensor(0.5))
    with pytest.raises(ValueError, match=r"outputs has 1 tensors but params has 2"):
        momentum_pass([p, p.clone()], [g, g.clone()], [b, b.clone()], [u])
    with pytest.raises(ValueError, match=r"outputs has 0 tensors but params has 1"):
        momentum_pass([p], [g], [b], [])
    with pytest.raises(ValueError, match=r"master_params\[0\] is given but the step writes no param"):
        ops.step_("muon_momentum", [p.bfloat16()], [g.bfloat16()], [p.clone()], [[b]], [], outputs=[u],
                  hyper=dict(momentum=0.9, nesterov=True), lr=0.0)
    with pytest.raises(ValueError, match=r"step_\(sgd\): outputs must be empty: the step writes the params"):
        ops.step_("sgd", [p], [g], [], [[b]], [torch.zeros(())], outputs=[u],
                  hyper=dict(momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False),
                  lr=0.1)
    for t, e in zip((p, g, b, u), before):
        assert_bitwise_equal(t, e)


# ---- the scaler, an overflow, clipping -------------------------------------------------------

def scaled_steps(opt, params, grads, scaler, scale, overflow_at=None):
    for step, step_grads in enumerate(grads):
        scaler.scale(torch.ones(()))
        for p, g in zip(params, step_grads):
            p.grad = (g.float() * scaler.get_scale()).to(p.dtype)
        if step == overflow_at:
            params[0].grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()


@pytest.mark.parametrize("scaler_cls", [fused_amp.GradScaler, torch.amp.GradScaler])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_scaled_steps_with_an_overflow_are_torchs_unscaled_steps(scaler_cls, dtype):
    """Scale 2^10 (exact: the unscaled grads are the given ones), an overflow at step 3 that
    must change nothing (masters, momentum) and halve the scale, as torch's recipe does."""
    init, grads = data(dtype, steps=6)
    params = [torch.nn.Parameter(x.clone()) for x in init]
    opt = Muon(params, lr=0.02)
    scaler = scaler_cls("cpu", init_scale=1024.0)
    scaled_steps(opt, params, grads, scaler, 1024.0, overflow_at=3)
    assert scaler.get_scale() == 512.0
    clean = grads[:3] + grads[4:]
    reference, spread = torch_spread(init, clean, dict(lr=0.02))
    assert max_distance(values(opt, params), reference) <= spread
    for p, g in zip(params, grads[-1]):  # left unscaled, as torch's optimizers leave them
        assert_bitwise_equal(p.grad, g)


def test_an_overflow_step_changes_nothing_not_even_the_grads():
    init, grads = data(torch.bfloat16, steps=2)
    params = [torch.nn.Parameter(x.clone()) for x in init]
    opt = Muon(params, lr=0.02)
    scaler = fused_amp.GradScaler("cpu", init_scale=256.0)
    scaled_steps(opt, params, grads[:1], scaler, 256.0)
    before = [t.clone() for p in params for t in (p.detach(), opt.state[p]["master_param"],
                                                   opt.state[p]["momentum_buffer"])]
    scaler.scale(torch.ones(()))
    for p, g in zip(params, grads[1]):
        p.grad = (g.float() * scaler.get_scale()).to(p.dtype)
    params[2].grad[1, 1] = float("nan")
    sent = [p.grad.clone() for p in params]
    scaler.step(opt)
    after = [t for p in params for t in (p.detach(), opt.state[p]["master_param"],
                                         opt.state[p]["momentum_buffer"])]
    for a, b in zip(after, before):
        assert_bitwise_equal(a, b)
    for p, g in zip(params, sent):
        assert_bitwise_equal(p.grad, g)


@pytest.mark.parametrize("how", ["max_grad_norm", "clip_grad_norm_"])
def test_clipping_is_torchs_clip_then_step(how):
    init, grads = data(torch.float32, steps=5)
    grads = [[g * 3 for g in step] for step in grads]  # always clipped at 1.0

    class ClippedMuon(torch.optim.Muon):
        def step(self, closure=None):
            torch.nn.utils.clip_grad_norm_([p for g in self.param_groups for p in g["params"]], 1.0)
            return super().step(closure)

    reference, spread = torch_spread(init, grads, dict(lr=0.02), make=ClippedMuon)
    if how == "max_grad_norm":
        params, opt = run_ours(init, grads, max_grad_norm=1.0)
    else:
        params, opt = run_ours(init, grads, before_step=lambda opt: opt.clip_grad_norm_(1.0))
    assert max_distance(params, reference) <= spread
    assert opt.last_grad_norm.item() > 1.0


# ---- memory modes ----------------------------------------------------------------------------


def test_remainder_masters_are_the_fp32_masters_bitwise():
    """The same masters bit for bit; the params are their rounding, to nearest even with fp32
    masters and ties away from zero with the remainder (they differ where a master is a tie)."""
    init, grads = data(torch.bfloat16)
    a, opt_a = run_ours(init, grads)
    b, opt_b = run_ours(init, grads, master_weights="remainder")
    master_b = opt_b.state_dict()["state"]
    for i, (p, q) in enumerate(zip(a, b)):
        master = opt_a.state[p]["master_param"]
        assert_bitwise_equal(master_b[i]["master_param"], master)
        assert_bitwise_equal(p.detach(), master.bfloat16())
        assert_bitwise_equal(q.detach(), bf16_ties_away(master))


@pytest.mark.parametrize("kw,per_param", [
    (dict(), 8), (dict(master_weights="remainder", state_dtype=torch.bfloat16), 4),
    (dict(master_weights="remainder8", state_dtype=torch.bfloat16), 3),
    (dict(master_weights="remainder", state_dtype=torch.uint8), 3 + 4 / 256),
    (dict(master_weights="remainder8", state_dtype=torch.uint8), 2 + 4 / 256)])
def test_state_bytes_and_steps_of_each_memory_mode(kw, per_param):
    """Bytes held per bf16 param besides the param and grad (with them, 4 more: 12, 8, 7, 7.02,
    6.02); the smaller modes stay near torch's Muon (bf16 or 8-bit momentum, 24-bit masters
    round)."""
    init, grads = data(torch.bfloat16, shapes=[s for s in SHAPES if s != (32, 48)])  # all 8-bit
    params, opt = run_ours(init, grads, **kw)
    for p in params:
        held = sum(t.numel() * t.element_size() for k, t in opt.state[p].items() if k != "step")
        assert held == per_param * p.numel()
    reference, _ = torch_spread(init, grads, dict(lr=0.02))
    masters = [s["master_param"] for s in opt.state_dict()["state"].values()]
    assert max_distance(masters, reference) < 5e-3  # a bf16 ulp of the O(1) weights is 8e-3


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.uint8], ids=str)
def test_stochastic_rounding_of_the_momentum_is_refused(state_dtype):
    with pytest.raises(ValueError, match="rounds 24-bit masters"):
        Muon([torch.nn.Parameter(torch.randn(4, 4).bfloat16())], state_dtype=state_dtype,
             stochastic_rounding=True)


def test_8bit_momentum_steps_as_fp32_momentum_from_the_same_state():
    """The first step starts from zero momentum, which 8-bit codes hold exactly: the pass
    computes the Newton-Schulz input from the same fp32 values, so the masters are bitwise the
    fp32-state run's; later steps start from the requantized momentum, and stay near."""
    init, grads = data(torch.bfloat16, steps=6, shapes=[(64, 256), (256, 64), (96, 96)])
    a, opt_a = run_ours(init, grads[:1])
    b, opt_b = run_ours(init, grads[:1], master_weights="remainder", state_dtype=torch.uint8)
    masters_b = [s["master_param"] for s in opt_b.state_dict()["state"].values()]
    for p, m in zip(a, masters_b):
        assert_bitwise_equal(opt_a.state[p]["master_param"], m)
    assert all(opt_b.state[p]["momentum_buffer"].dtype == torch.uint8 for p in b)
    a, opt_a = run_ours(init, grads)
    b, opt_b = run_ours(init, grads, master_weights="remainder", state_dtype=torch.uint8)
    masters_b = [s["master_param"] for s in opt_b.state_dict()["state"].values()]
    assert max_distance(values(opt_a, a), masters_b) < 5e-3


# ---- the constructor and the step's checks, as torch's ------------------------------------------

def test_signature_is_torchs_plus_our_keywords():
    assert_our_keywords(inspect.signature(Muon.__init__).parameters,
                        inspect.signature(torch.optim.Muon.__init__).parameters)


@pytest.mark.parametrize("kw,shape", [
    (dict(lr=-1.0), (4, 4)), (dict(lr=torch.tensor([1.0, 2.0])), (4, 4)), (dict(momentum=-0.1), (4, 4)),
    (dict(weight_decay=-1.0), (4, 4)), (dict(adjust_lr_fn="rms"), (4, 4)), (dict(), (4,)),
    (dict(), (2, 3, 4))])
def test_constructor_refuses_what_torch_refuses_with_its_message(kw, shape):
    outcomes = []
    for cls in (torch.optim.Muon, Muon):
        with pytest.raises(ValueError) as e:
            cls([torch.nn.Parameter(torch.randn(shape))], **kw)
        outcomes.append(str(e.value))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("kw", [dict(ns_steps=100), dict(ns_coefficients=(1.0, 2.0))])
def test_bad_newton_schulz_options_raise_torchs_error_before_any_change(kw):
    """torch raises inside its step, after it changed the first momentum; ours before."""
    messages = []
    for cls in (torch.optim.Muon, Muon):
        params = [torch.nn.Parameter(torch.ones(4, 8)) for _ in range(2)]
        opt = cls(params, **kw)
        for p in params:
            p.grad = torch.ones_like(p)
        with pytest.raises(ValueError) as e:
            opt.step()
        messages.append(str(e.value))
    assert messages[0] == messages[1]
    assert all(torch.equal(p.detach(), torch.ones(4, 8)) for p in params)
    assert all(not opt.state[p] or not opt.state[p]["momentum_buffer"].any() for p in params)


def test_a_sparse_grad_is_refused_before_any_change():
    params = [torch.nn.Parameter(torch.ones(4, 8)) for _ in range(2)]
    opt = Muon(params)
    params[0].grad = torch.ones(4, 8)
    params[1].grad = torch.ones(4, 8).to_sparse()  # torch's Muon refuses it too
    with pytest.raises(ValueError, match=r"grads\[1\] is sparse"):
        opt.step()
    assert all(torch.equal(p.detach(), torch.ones(4, 8)) for p in params)
    assert not opt.state[params[0]]["momentum_buffer"].any()


# ---- checkpoints -------------------------------------------------------------------------------

def test_checkpoints_load_both_ways_with_torchs_muon():
    init, grads = data(torch.float32, steps=6)
    ours, opt = run_ours(init, grads[:3])
    theirs, torch_opt = torch_run(init, grads[:3], dict(lr=0.02))
    # ours into torch's and torch's into ours, then three more steps each
    crossed_torch = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    t = torch.optim.Muon(crossed_torch, lr=0.02)
    t.load_state_dict(opt.state_dict())
    crossed_ours = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
    o = Muon(crossed_ours, lr=0.02)
    o.load_state_dict(torch_opt.state_dict())
    for p, q in zip(crossed_ours, theirs):
        assert_bitwise_equal(o.state[p]["momentum_buffer"], torch_opt.state[q]["momentum_buffer"])
    for step_grads in grads[3:]:
        for opt_, params in ((t, crossed_torch), (o, crossed_ours)):
            for p, g in zip(params, step_grads):
                p.grad = g.clone()
            opt_.step()
    reference, spread = torch_spread(init, grads, dict(lr=0.02))
    assert max_distance(crossed_torch, reference) <= spread
    assert max_distance(crossed_ours, reference) <= spread


@pytest.mark.parametrize("copy_by", ["deepcopy", "pickle", "load_state_dict"])
def test_a_copied_or_reloaded_muon_loads_its_own_checkpoint(copy_by):
    """torch's Optimizer adds differentiable=False to `defaults` whenever it sets its state again
    (deepcopy, unpickling, load_state_dict); Muon's groups have no such key, in torch's
    checkpoints or ours, and must load all the same (found by torch's OptimizerInfo tests)."""
    init, grads = data(torch.float32, steps=2)
    _, opt = run_ours(init, grads)
    saved = opt.state_dict()
    if copy_by == "deepcopy":
        other = copy.deepcopy(opt)
    elif copy_by == "pickle":
        other = pickle.loads(pickle.dumps(opt))
    else:
        other = opt
        other.load_state_dict(saved)
    other.load_state_dict(saved)
    torch_opt = torch.optim.Muon([torch.nn.Parameter(p.detach().clone()) for p in init], lr=0.02)
    torch_opt.load_state_dict(saved)
    other.load_state_dict(torch_opt.state_dict())
    for p, q in zip(other.param_groups[0]["params"], torch_opt.param_groups[0]["params"]):
        assert_bitwise_equal(other.state[p]["momentum_buffer"], torch_opt.state[q]["momentum_buffer"])


def test_a_checkpoint_holds_fp32_masters_and_the_momentum_in_its_state_dtype():
    """As every optimizer of ours: remainders are saved as the fp32 master they make."""
    init, grads = data(torch.bfloat16, steps=2)
    params, opt = run_ours(init, grads, master_weights="remainder", state_dtype=torch.bfloat16)
    for entry in opt.state_dict()["state"].values():
        assert entry["master_param"].dtype == torch.float32
        assert entry["momentum_buffer"].dtype == torch.bfloat16
        assert "master_remainder" not in entry


# ---- Muon + AdamW with one scaler; DDP ------------------------------------------------------

def model_and_groups(dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 32), torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 50))
    model.to(dtype)
    hidden = [model[1].weight, model[3].weight]
    rest = [p for p in model.parameters() if all(p is not h for h in hidden)]
    return model, hidden, rest


def recipe_run(which, steps=8, overflow_at=3, overflow_in="loss", dtype=torch.bfloat16):
    """``overflow_in``: "loss" (every grad), "hidden" or "rest" (one grad of that optimizer)."""
    model, hidden, rest = model_and_groups(dtype if which == "ours" else torch.float32)
    if which == "ours":
        muon, adamw = Muon(hidden, lr=0.02), AdamW(rest, lr=1e-3)
        scaler = fused_amp.GradScaler("cpu", init_scale=1024.0)
    else:
        muon, adamw = torch.optim.Muon(hidden, lr=0.02), torch.optim.AdamW(rest, lr=1e-3, foreach=False)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        tokens = torch.randint(0, 50, (4, 12), generator=gen)
        muon.zero_grad()
        adamw.zero_grad()
        logits = model(tokens[:, :-1]).float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), tokens[:, 1:].reshape(-1))
        if step == overflow_at and overflow_in == "loss":
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        if step == overflow_at and overflow_in != "loss":
            (hidden if overflow_in == "hidden" else rest)[0].grad[0, 0] = float("inf")
        scaler.step(muon)
        scaler.step(adamw)
        scaler.update()
    return model, muon, adamw, scaler


@pytest.mark.parametrize("overflow_in", ["loss", "hidden", "rest"])
def test_muon_and_adamw_under_one_scaler_train_as_torchs_recipe(overflow_in):
    """bf16 weights with masters against torch's recipe in fp32 (the same scaler calls): an
    overflow skips the optimizer whose grads hold it (both, for an inf loss) and halves the
    scale, as torch's scaler does, and the weights stay within a bf16 rounding of torch's."""
    model, muon, adamw, scaler = recipe_run("ours", overflow_in=overflow_in)
    ref_model, _, ref_adamw, ref_scaler = recipe_run("torch", overflow_in=overflow_in)
    assert scaler.get_scale() == ref_scaler.get_scale() == 512.0
    muon_steps = 8.0 if overflow_in == "rest" else 7.0
    assert all(float(muon.state[p]["step"]) == muon_steps for p in muon.param_groups[0]["params"])
    adamw_steps = [float(ref_adamw.state[p]["step"]) for p in ref_adamw.param_groups[0]["params"]]
    assert adamw_steps == [float(adamw.state[p]["step"]) for p in adamw.param_groups[0]["params"]]
    assert adamw_steps[0] == (8.0 if overflow_in == "hidden" else 7.0)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert (p.float() - q).abs().max().item() < 0.02  # bf16 grads and weights vs fp32 ones


def ddp_muon_run(rank, world):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 32, bias=False), torch.nn.Tanh(),
                            torch.nn.Linear(32, 4, bias=False)).bfloat16())
    opt = Muon(model.parameters(), lr=0.02)
    scaler = fused_amp.GradScaler("cpu", init_scale=256.0)
    for step in range(4):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 16, generator=gen).bfloat16()
        if step == 2 and rank == 1:
            x[0, 0] = float("inf")  # an overflow on one rank skips the step on all
        opt.zero_grad()
        scaler.scale(model(x).float().pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
    return [opt.state[p]["master_param"].clone() for p in model.parameters()], scaler.get_scale()


def test_ddp_ranks_stay_bitwise_equal_through_an_overflow_on_one_rank():
    results = run_ranks(ddp_muon_run, 2)
    (masters_0, scale_0), (masters_1, scale_1) = results
    assert scale_0 == scale_1 == 128.0
    for a, b in zip(masters_0, masters_1):
        assert torch.equal(a, b)


def muon_model():
    torch.manual_seed(0)
    # (33, 16) shards unevenly over 2 ranks (17 + 16 rows), as FSDP2 chunks it
    return torch.nn.Sequential(torch.nn.Linear(16, 33, bias=False), torch.nn.Tanh(),
                               torch.nn.Linear(33, 16, bias=False), torch.nn.Tanh(),
                               torch.nn.Linear(16, 33, bias=False)).bfloat16()


def muon_train(model, opt, rank, steps=4, overflow_at=None, max_norm=None):
    scaler = fused_amp.GradScaler("cpu", init_scale=256.0)
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 * step)  # the same batch on every rank
        x = torch.randn(8, 16, generator=gen).bfloat16()
        if step == overflow_at and rank == 1:
            x[0, 0] = float("inf")
        opt.zero_grad()
        scaler.scale(model(x).float().pow(2).mean()).backward()
        if max_norm is not None:
            opt.clip_grad_norm_(max_norm)
        scaler.step(opt)
        scaler.update()
    return scaler


def fsdp_muon_run(rank, world, overflow_at, max_norm):
    from torch.distributed.fsdp import fully_shard

    model = muon_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = Muon(model.parameters(), lr=0.02)
    scaler = muon_train(model, opt, rank, overflow_at=overflow_at, max_norm=max_norm)
    params = list(model.parameters())
    return dict(full=[p.full_tensor() for p in params],
                masters=[opt.state[p]["master_param"].full_tensor() for p in params],
                local_rows=[p.to_local().shape[0] for p in params],
                steps=[float(opt.state[p]["step"]) for p in params], scale=scaler.get_scale())


@pytest.mark.parametrize("overflow_at,max_norm", [(None, None), (2, None), (None, 0.05)])
def test_fsdp2_shards_step_as_the_single_process_run(overflow_at, max_norm):
    """Every rank trains on the same batch, so the averaged grads are exact: the whole matrices
    sent from the shards to their owner ranks go through the same Newton-Schulz (a rank that owns
    none of a shape included), and the weights and masters must
    be the single-process run's bit for bit (an overflow on one rank: skipped by both, as by the
    single process that skips that step)."""
    results = run_ranks(fsdp_muon_run, 2, overflow_at, max_norm)
    assert results[0]["local_rows"] == [17, 8, 17] and results[1]["local_rows"] == [16, 8, 16]
    model = muon_model()
    opt = Muon(model.parameters(), lr=0.02)
    steps = 4 if overflow_at is None else 2  # the steps before the overflow ...
    muon_train(model, opt, 0, steps=steps, max_norm=max_norm)
    if overflow_at is not None:  # ... and after it, on the batches the ranks saw
        scaler = fused_amp.GradScaler("cpu", init_scale=128.0)
        for step in (3,):
            gen = torch.Generator().manual_seed(100 * step)
            x = torch.randn(8, 16, generator=gen).bfloat16()
            opt.zero_grad()
            scaler.scale(model(x).float().pow(2).mean()).backward()
            scaler.step(opt)
            scaler.update()
    for r in results:
        assert r["steps"] == [float(4 if overflow_at is None else 3)] * 3
        for a, p in zip(r["full"], model.parameters()):
            assert torch.equal(a, p.detach())
        for a, p in zip(r["masters"], model.parameters()):
            assert torch.equal(a, opt.state[p]["master_param"])


# ---- torch.compile -------------------------------------------------------------------------------

@pytest.mark.parametrize("max_grad_norm", [None, 100.0])
def test_the_step_compiles_as_one_graph_and_steps_as_torch(max_grad_norm):
    """optimizer.step() under torch.compile(fullgraph=True) with a scaler's grad_scale and
    found_inf (an overflow at step 2) and clipping (at 100: the norm pass and the coefficient
    trace, nothing is clipped). Not eager's bits: inductor writes lerp as its own formula (an
    fp32 ulp in the momentum, which Newton-Schulz's bf16 roundings amplify, as any reordering);
    within the spread of torch's reordered Muon plus how far torch's own Muon moves when
    compiled."""
    torch._dynamo.reset()
    init, grads = data(torch.bfloat16, steps=5)
    params = [torch.nn.Parameter(x.clone()) for x in init]
    opt = Muon(params, lr=0.02, max_grad_norm=max_grad_norm)
    step = torch.compile(opt.step, fullgraph=True)
    for i, step_grads in enumerate(grads):
        for p, g in zip(params, step_grads):
            p.grad = g * 64
        if i == 2:
            params[0].grad[0, 0] = float("inf")
        opt.grad_scale, opt.found_inf = torch.tensor(64.0), torch.tensor(float(i == 2))
        step()
        del opt.grad_scale, opt.found_inf
    clean = grads[:2] + grads[3:]
    reference, spread = torch_spread(init, clean, dict(lr=0.02))
    torch._dynamo.reset()
    compiled_torch, _ = torch_run(init, clean, dict(lr=0.02), make=CompiledTorchMuon)
    spread += max_distance(compiled_torch, reference)
    assert max_distance(values(opt, params), reference) <= spread
    assert all(float(opt.state[p]["step"]) == 4.0 for p in params)


class CompiledTorchMuon(torch.optim.Muon):
    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self._compiled_step = torch.compile(super().step)

    def step(self, closure=None):
        return self._compiled_step(closure)
