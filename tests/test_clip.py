"""Gradient clipping inside the fused step: ops.grad_norm_, the optimizers' max_grad_norm and
clip_grad_norm_, against torch's recipe (GradScaler.unscale_, torch.nn.utils.clip_grad_norm_,
torch's optimizer). Tolerances come from how far torch's own implementations differ."""
import copy
import math

import pytest
import torch

import fused_amp
from fused_amp import ops
from helpers import assert_bitwise_equal
from optim_registry import CASES, IDS, PARAM_DTYPES, torch_impls

NORM_TYPES = [2.0, 1.0, math.inf]
SIZES = [1, 7, 1000, 65535, 65536, 65537, 300001]
GRAD_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def grad_norm(tensors, inv_scale=None, norm_type=2.0):
    found, norm = torch.zeros(()), torch.full((), -1.0)
    ops.grad_norm_(tensors, found, norm, inv_scale, norm_type)
    return norm, found


def torch_norms(unscaled, norm_type):
    """torch's two implementations of the total norm (foreach and per tensor), in float64."""
    return [torch.nn.utils.get_total_norm(unscaled, norm_type, foreach=f).double() for f in (True, False)]


# ---- the op ------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm_type", NORM_TYPES)
@pytest.mark.parametrize("dtype", GRAD_DTYPES)
def test_grad_norm_is_as_close_to_the_exact_norm_as_torch(dtype, norm_type):
    """The norm of grads * inv_scale, against the float64 norm of the same unscaled values: no
    further from it than torch's foreach and per-tensor norms of those values in fp32 are (or
    one fp32 ulp: the result itself is an fp32 value)."""
    gen = torch.Generator().manual_seed(int(norm_type) if norm_type != math.inf else 9)
    grads = [(torch.randn(n, generator=gen) * 3).to(dtype) for n in SIZES]
    inv = torch.tensor(2.0 ** -7)
    norm, found = grad_norm(grads, inv, norm_type)
    unscaled = [g.double() * inv.double() for g in grads]
    exact = torch.linalg.vector_norm(torch.cat(unscaled), norm_type)
    fp32 = [u.to(torch.float32 if dtype != torch.float64 else torch.float64) for u in unscaled]
    torch_error = max((t - exact).abs().item() for t in torch_norms(fp32, norm_type))
    one_ulp = torch.finfo(torch.float32).eps * exact.item()
    assert (norm.double() - exact).abs().item() <= max(torch_error, one_ulp)
    assert found.item() == 0.0 and norm.dtype == torch.float32


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_grad_norm_has_the_same_bits_for_any_thread_count(norm_type):
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(n, generator=gen).bfloat16() for n in SIZES] + [torch.randn(10 ** 6, generator=gen)]
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3, 4):
            torch.set_num_threads(n)
            results.append(grad_norm(grads, torch.tensor(0.5), norm_type)[0])
    finally:
        torch.set_num_threads(threads)
    for r in results[1:]:
        assert_bitwise_equal(r, results[0])


@pytest.mark.parametrize("norm_type", NORM_TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_grad_norm_flags_inf_and_nan_as_torch_norms_them(dtype, norm_type):
    """An inf makes the norm inf and a NaN makes it NaN, as in torch's norm; both set found_inf.
    Finite values whose squares overflow give an inf norm but no found_inf, as torch's check."""
    for bad in (math.inf, -math.inf, math.nan):
        grads = [torch.randn(100).to(dtype), torch.randn(70000).to(dtype)]
        grads[1][12345] = bad
        norm, found = grad_norm(grads, torch.tensor(0.5), norm_type)
        expected = torch.nn.utils.get_total_norm([g.float() * 0.5 for g in grads], norm_type)
        assert_bitwise_equal(norm.isnan(), expected.isnan())
        assert norm.isinf().item() == expected.isinf().item() and found.item() == 1.0
    if norm_type == 2.0:
        norm, found = grad_norm([torch.full((10,), 1e30)], None, 2.0)
        assert norm.isinf().item() and found.item() == 0.0


def test_grad_norm_of_nothing_is_zero_and_reads_only():
    norm, found = grad_norm([torch.zeros(0)])
    assert norm.item() == 0.0 and found.item() == 0.0
    grads = [torch.randn(5), torch.randn(3, 4).t()]  # a non-contiguous grad goes through a copy
    before = [g.clone() for g in grads]
    norm, _ = grad_norm(grads, torch.tensor(0.25))
    assert all(torch.equal(a, b) for a, b in zip(grads, before))
    exact = torch.linalg.vector_norm(torch.cat([g.double().flatten() * 0.25 for g in grads]))
    assert abs(norm.item() - exact.item()) <= 1e-6 * exact.item()


@pytest.mark.parametrize("bad,match", [
    (dict(norm_type=3.0), "norm_type must be 1.0, 2.0 or inf"),
    (dict(norm_type=-math.inf), "norm_type must be 1.0, 2.0 or inf"),
    (dict(norm=torch.zeros((), dtype=torch.float64)), "norm"),
    (dict(norm=torch.zeros(2)), "norm"),
    (dict(inv_scale=torch.zeros(2)), "inv_scale"),
    (dict(tensors=[torch.zeros(3, dtype=torch.int32)]), "tensors"),
])
def test_grad_norm_bad_input_names_the_argument(bad, match):
    args = dict(tensors=[torch.ones(3)], found_inf=torch.zeros(()), norm=torch.zeros(()),
                inv_scale=None, norm_type=2.0)
    args.update(bad)
    with pytest.raises((ValueError, TypeError), match=match):
        ops.grad_norm_(**args)
    assert args["found_inf"].item() == 0.0


# ---- the optimizers: generic over the registry --------------------------------------------------

SCALE = 2.0 ** 10
SHAPES = [(64, 33), (1000,), (7,), (3, 5, 9)]
MAX_NORM = 20.0  # the grads' norms spread around it: some steps clip, some do not


def grads_for(step, dtype, gen):
    """Scaled grads as backward would leave them (in the param dtype), and a step with an inf."""
    spread = 0.5 + 2.0 * (step % 3)
    return [(torch.randn(s, generator=gen) * spread * SCALE).to(dtype) for s in SHAPES]


def run_recipe(kind, cls, torch_cls, kw, dtype, steps=30, overflow_at=7):
    """``kind``: "torch_fused"/"torch_foreach" (fp32 copies, torch GradScaler, unscale_,
    clip_grad_norm_ with foreach on/off, torch's optimizer fused/foreach), or ours:
    "max_grad_norm", "clip", "unscale_clip" (scaler.unscale_ first), "no_scaler", and the same
    under torch's GradScaler: "torch_scaler/clip", "torch_scaler/unscale_clip"."""
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen).to(dtype) for s in SHAPES]
    ours = kind not in ("torch_fused", "torch_foreach")
    params = [torch.nn.Parameter(x.clone() if ours else x.float()) for x in init]
    if ours:
        scaler_module, _, kind = kind.rpartition("/")
        opt = cls(params, **kw, max_grad_norm=MAX_NORM if kind == "max_grad_norm" else None)
        scaler = (torch.amp if scaler_module == "torch_scaler" else fused_amp).GradScaler(
            "cpu", init_scale=SCALE, growth_interval=1000)
    else:
        opt = torch_cls(params, **kw, **torch_impls(torch_cls)[0 if kind == "torch_fused" else 1])
        scaler = torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=1000)
    norms, exact, grads_after = [], [], None
    for step in range(steps):
        grads = grads_for(step, dtype, gen)
        if step == overflow_at:
            grads[1][3] = math.inf
        if kind == "no_scaler":
            grads = [(g.float() / SCALE).to(dtype) for g in grads]
        unscale = 1.0 if kind == "no_scaler" else 1 / scaler.get_scale()  # (backs off at the inf)
        exact.append(torch.linalg.vector_norm(torch.cat([g.double().flatten() * unscale for g in grads])))
        opt.zero_grad()
        if kind != "no_scaler":
            scaler.scale(torch.ones(()))  # the scale as a loss would be scaled
        for p, g in zip(params, grads):
            p.grad = g.clone() if ours else g.float()
        if not ours:
            scaler.unscale_(opt)
            norms.append(torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=kind == "torch_foreach"))
        elif kind == "unscale_clip":
            scaler.unscale_(opt)
            norms.append(opt.clip_grad_norm_(MAX_NORM))
        elif kind in ("clip", "no_scaler"):
            norms.append(opt.clip_grad_norm_(MAX_NORM))
        if kind == "no_scaler":
            if step == overflow_at:
                continue  # without a scaler nothing skips: leave the inf out
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        if kind == "max_grad_norm":
            norms.append(opt.last_grad_norm)
        grads_after = [p.grad.clone() for p in params]
    state = opt.state
    values = [state[p]["master_param"] if "master_param" in state[p] else p for p in params]
    return torch.cat([v.detach().float().flatten() for v in values]), norms, exact, grads_after


OUR_KINDS = ["max_grad_norm", "clip", "unscale_clip", "torch_scaler/max_grad_norm",
             "torch_scaler/clip", "torch_scaler/unscale_clip"]


def clipped_tolerance(fused, foreach):
    """The optimizer tests' rule (within torch's fused/foreach spread, at least one fp32 ulp),
    with a floor of two ulps: our norm and torch's are each within an ulp of the exact norm (the
    op tests above), so the clip coefficients may be two ulps apart, which torch's two recipes,
    sharing one norm where their norms agree (as on the portable build), never show."""
    two_ulps = 2 * torch.finfo(torch.float32).eps * fused.abs().max().item()
    return max((foreach - fused).abs().max().item(), two_ulps)


@pytest.mark.parametrize("kind", OUR_KINDS)
@pytest.mark.parametrize("dtype", PARAM_DTYPES)
@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_clipped_steps_match_torchs_recipe(cls, torch_cls, kw, dtype, kind):
    """30 clipped steps through a GradScaler (ours, or torch's kept while only the optimizer is
    swapped), one of them skipped for an inf: our params end no further from torch's recipe
    (fused) than torch's foreach recipe ends from it (at least one fp32 ulp); the norms returned
    or logged are torch's within the same rule (under torch's scaler without unscale_, once the
    step has run); after the last step p.grad holds the unscaled, clipped grads, as torch leaves
    them."""
    if kind == "torch_scaler/unscale_clip" and dtype == torch.float16:
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
            run_recipe(kind, cls, torch_cls, kw, dtype)  # torch's refusal: clip without unscale_
        return
    ours, our_norms, exact, our_grads = run_recipe(kind, cls, torch_cls, kw, dtype)
    fused, fused_norms, _, fused_grads = run_recipe("torch_fused", cls, torch_cls, kw, dtype)
    foreach, foreach_norms, _, _ = run_recipe("torch_foreach", cls, torch_cls, kw, dtype)
    assert (ours - fused).abs().max().item() <= clipped_tolerance(fused, foreach)
    assert len(our_norms) == len(fused_norms) == len(exact)
    for step, (a, b, c, e) in enumerate(zip(our_norms, fused_norms, foreach_norms, exact)):
        assert a.dtype == torch.float32 and a.shape == ()
        if not e.isfinite():  # the skipped step
            assert not a.isfinite() and not b.isfinite(), step
            continue
        # the rule of test_grad_norm_is_as_close_to_the_exact_norm_as_torch, step by step
        torch_error = max(abs(b.item() - e.item()), abs(c.item() - e.item()))
        one_ulp = torch.finfo(torch.float32).eps * e.item()
        assert abs(a.item() - e.item()) <= max(torch_error, one_ulp), (step, a.item(), e.item())
    clipped = our_norms[-1].item() > MAX_NORM
    for g, t in zip(our_grads, fused_grads):  # rounded once in the grad dtype, torch's twice
        assert torch.allclose(g.float(), t, rtol=2 * torch.finfo(dtype).eps if clipped else 0,
                              atol=0), "p.grad after the step"


@pytest.mark.parametrize("dtype", PARAM_DTYPES)
@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_clip_without_a_scaler_matches_torch(cls, torch_cls, kw, dtype):
    """bf16 training usually has no scaler: clip_grad_norm_ on unscaled grads."""
    ours, _, _, _ = run_recipe("no_scaler", cls, torch_cls, kw, dtype)
    # torch's recipe on the same unscaled grads, by the optimizer alone
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen).to(dtype) for s in SHAPES]
    finals = []
    for flags in torch_impls(torch_cls):
        g2 = torch.Generator().manual_seed(0)
        [torch.randn(s, generator=g2) for s in SHAPES]
        params = [torch.nn.Parameter(x.float()) for x in init]
        opt = torch_cls(params, **kw, **flags)
        for step in range(30):
            grads = [(g.float() / SCALE).to(dtype) for g in grads_for(step, dtype, g2)]
            if step == 7:
                continue
            for p, g in zip(params, grads):
                p.grad = g.float()
            torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=flags.get("foreach", False))
            opt.step()
        finals.append(torch.cat([p.detach().flatten() for p in params]))
    fused, foreach = finals
    assert (ours - fused).abs().max().item() <= clipped_tolerance(fused, foreach)


def test_the_coefficient_adds_torchs_1e_6_to_the_norm():
    """At a norm of 1e-6 the 1e-6 torch adds to the norm halves the coefficient: grads of that
    norm clipped to 0.5e-6 move SGD's params by a quarter of the grads, as in torch's recipe."""
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(40, generator=gen), torch.randn(9, generator=gen)]
    total = torch.linalg.vector_norm(torch.cat(grads))
    grads = [g / total * 1e-6 for g in grads]

    def run(ours):
        params = [torch.nn.Parameter(torch.zeros(40)), torch.nn.Parameter(torch.zeros(9))]
        opt = fused_amp.optim.SGD(params, lr=1.0) if ours else torch.optim.SGD(params, lr=1.0)
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.clip_grad_norm_(0.5e-6) if ours else torch.nn.utils.clip_grad_norm_(params, 0.5e-6)
        opt.step()
        return torch.cat([p.detach() for p in params])

    ours, theirs = run(True), run(False)
    torch.testing.assert_close(theirs, -0.25 * torch.cat(grads), rtol=1e-5, atol=0)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)


def test_an_inf_grad_without_a_scaler_does_what_torchs_clip_does():
    """No scaler, nothing skips: the inf makes the norm inf and the coefficient 0, so the inf
    element's update is NaN and the others get a zero grad, as torch's recipe gives."""
    def run(ours):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(40)), torch.nn.Parameter(torch.randn(9))]
        opt = (fused_amp.optim.SGD(params, lr=0.1, momentum=0.9) if ours
               else torch.optim.SGD(params, lr=0.1, momentum=0.9))
        for step in range(3):
            for p in params:
                p.grad = torch.randn_like(p)
            if step == 1:
                params[1].grad[4] = math.inf
            norm = (opt.clip_grad_norm_(1.0) if ours else torch.nn.utils.clip_grad_norm_(params, 1.0))
            opt.step()
        return [p.detach().clone() for p in params], norm
    (ours, n1), (theirs, n2) = run(True), run(False)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.isnan(), b.isnan()) and a.isnan().any() | True
        assert torch.allclose(a.nan_to_num(), b.nan_to_num(), rtol=1e-6, atol=1e-7)
    assert n1.isnan().item() == n2.isnan().item()


def test_one_read_pass_serves_the_norm_and_the_overflow_check(monkeypatch):
    """With our scaler, the norm pass is the overflow check: no separate non_finite_check_."""
    calls = []
    for name in ("grad_norm_", "non_finite_check_", "unscale_"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _n=name, _r=real, **k: (calls.append(_n), _r(*a, **k))[1])
    for explicit in (False, True):
        calls.clear()
        model = torch.nn.Linear(8, 8).bfloat16()
        opt = fused_amp.optim.AdamW(model.parameters(), max_grad_norm=None if explicit else 1.0)
        scaler = fused_amp.GradScaler("cpu")
        for _ in range(2):
            opt.zero_grad()
            scaler.scale(model(torch.randn(4, 8).bfloat16()).float().sum()).backward()
            if explicit:
                opt.clip_grad_norm_(1.0)
            scaler.step(opt)
            scaler.update()
        assert calls == ["grad_norm_"] * 2, calls
        assert opt.state[next(iter(model.parameters()))]["step"].item() == 2


def test_error_if_nonfinite_raises_before_anything_changes():
    p = torch.nn.Parameter(torch.randn(5))
    opt = fused_amp.optim.Adam([p])
    p.grad = torch.tensor([1.0, math.nan, 0.0, 0.0, 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        opt.clip_grad_norm_(1.0, error_if_nonfinite=True)
    p.grad = torch.ones(5)
    before = p.detach().clone()
    opt.step()  # no clip pending from the failed call: a plain Adam step
    assert torch.allclose(before - p.detach(), torch.full((5,), 1e-3), atol=1e-6)


def test_zero_grad_drops_a_clip_not_yet_applied():
    p = torch.nn.Parameter(torch.zeros(4))
    opt = fused_amp.optim.SGD([p], lr=1.0)
    p.grad = torch.full((4,), 10.0)
    opt.clip_grad_norm_(1.0)
    opt.zero_grad()
    p.grad = torch.full((4,), 0.25)
    opt.step()
    assert torch.equal(p.detach(), torch.full((4,), -0.25))


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_grad_norm=-1.0), "max_grad_norm"),
    (dict(max_grad_norm=0.0), "max_grad_norm"),
    (dict(max_grad_norm=math.inf), "max_grad_norm"),
    (dict(max_grad_norm="1"), "max_grad_norm"),
    (dict(max_grad_norm=1.0, grad_norm_type=3.0), "grad_norm_type"),
])
@pytest.mark.parametrize("cls", sorted({c for c, _, _ in CASES}, key=lambda c: c.__name__))
def test_bad_clip_options_are_refused(cls, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        cls([torch.nn.Parameter(torch.zeros(2))], **kwargs)


@pytest.mark.parametrize("cls", sorted({c for c, _, _ in CASES}, key=lambda c: c.__name__))
def test_clip_options_survive_pickling_and_deepcopy(cls):
    opt = cls([torch.nn.Parameter(torch.zeros(2))], max_grad_norm=0.5, grad_norm_type=math.inf)
    for other in (copy.deepcopy(opt), __import__("pickle").loads(__import__("pickle").dumps(opt))):
        assert other.max_grad_norm == 0.5 and other.grad_norm_type == math.inf


def test_other_norm_types_go_through_torch():
    """clip_grad_norm_ takes torch's other norm types too (computed by torch, not fused)."""
    p = torch.nn.Parameter(torch.zeros(50))
    opt = fused_amp.optim.SGD([p], lr=1.0)
    scaler = fused_amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale(torch.ones(()))
    g = torch.randn(50)
    p.grad = g * 8.0
    norm = opt.clip_grad_norm_(0.1, norm_type=3.0)
    assert torch.allclose(norm, torch.linalg.vector_norm(g, 3.0))
    scaler.step(opt)
    expected = -g * (0.1 / (torch.linalg.vector_norm(g, 3.0) + 1e-6))
    assert torch.allclose(p.detach(), expected, rtol=1e-5)


def test_a_converted_training_loop_matches_torchs():
    """The README's one-line change: torch's loop with scaler.unscale_ and clip_grad_norm_,
    against ours with optimizer.clip_grad_norm_ and no unscale_, on a tiny model for 20 steps."""
    def loop(ours):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        opt = (fused_amp.optim.AdamW(model.parameters(), lr=1e-2) if ours
               else torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True))
        scaler = (fused_amp.GradScaler if ours else torch.amp.GradScaler)("cpu", init_scale=2.0 ** 12)
        gen = torch.Generator().manual_seed(1)
        norms = []
        for _ in range(20):
            x, y = torch.randn(32, 16, generator=gen), torch.randn(32, 4, generator=gen)
            opt.zero_grad()
            scaler.scale(((model(x) - y) ** 2).sum()).backward()
            if ours:
                norms.append(opt.clip_grad_norm_(1.0))
            else:
                scaler.unscale_(opt)
                norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
            scaler.step(opt)
            scaler.update()
        return [p.detach() for p in model.parameters()], torch.stack(norms)
    (ours, n_ours), (theirs, n_theirs) = loop(True), loop(False)
    assert (n_ours > 1.0).all()  # every step clipped
    assert torch.allclose(n_ours, n_theirs, rtol=1e-5)
    for a, b in zip(ours, theirs):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_an_optimizer_stepped_without_a_scaler_is_not_unscaled_by_another_ones():
    """Two models in one process, one under a GradScaler and one without: once each has
    stepped, clip_grad_norm_ of the unscaled one takes its grads as they are."""
    a, b = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(4))
    opt_a, opt_b = fused_amp.optim.SGD([a], lr=0.1), fused_amp.optim.SGD([b], lr=0.1)
    scaler = fused_amp.GradScaler("cpu", init_scale=64.0)
    for _ in range(2):
        scaler.scale(torch.ones(()))  # model a's scaled loss
        a.grad, b.grad = torch.full((4,), 64.0), torch.full((4,), 1.0)
        norm_a = opt_a.clip_grad_norm_(10.0)
        norm_b = opt_b.clip_grad_norm_(10.0)
        scaler.step(opt_a)
        scaler.update()
        opt_b.step()
    assert norm_a.item() == 2.0  # sqrt(4) of the unscaled 1.0s
    assert norm_b.item() == 2.0  # b's own grads: not divided by a's scale
