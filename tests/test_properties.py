"""Property-based tests (hypothesis): random dtypes, sizes, strides, values and group layouts
against pure-PyTorch references. The invariant everywhere: either the reference's result, or
an exception with every tensor bitwise unchanged."""
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fused_amp import ops
from helpers import assert_bitwise_equal
from optim_registry import OPTIMIZERS, torch_impls

# FUSED_AMP_HYPOTHESIS_EXAMPLES raises the count for a longer search than CI's
SETTINGS = settings(max_examples=int(os.environ.get("FUSED_AMP_HYPOTHESIS_EXAMPLES", 60)),
                    deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SPECIAL = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, 6e4, 1e30, -3.0]


@st.composite
def tensors(draw, dtypes=FLOATS, max_side=40, allow_special=True):
    """A tensor of random dtype, shape and layout: contiguous, transposed, or a view with gaps
    or an offset start."""
    dtype = draw(st.sampled_from(dtypes))
    rows, cols = draw(st.integers(0, max_side)), draw(st.integers(1, 9))
    seed = draw(st.integers(0, 2 ** 16))
    values = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 4
    if allow_special and rows and draw(st.booleans()):
        values[draw(st.integers(0, rows - 1)), draw(st.integers(0, cols - 1))] = draw(st.sampled_from(SPECIAL))
    values = values.to(dtype)
    layout = draw(st.sampled_from(["contiguous", "transposed", "gaps", "offset"]))
    if layout == "transposed":
        return values.t().contiguous().t()
    if layout == "gaps":
        base = torch.zeros(rows, 2 * cols, dtype=dtype)
        base[:, ::2] = values
        return base[:, ::2]
    if layout == "offset":
        base = torch.zeros(rows * cols + 1, dtype=dtype)
        base[1:] = values.flatten()
        return base[1:].view(rows, cols)
    return values


def snapshot(ts):
    return [t.clone() for t in ts]


def assert_unchanged(ts, before):
    for t, b in zip(ts, before):
        assert_bitwise_equal(t, b)


def opmath(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


# ---- unscale_ and non_finite_check_ -----------------------------------------------------------

@st.composite
def unscale_lists(draw):
    ts = draw(st.lists(tensors(), min_size=0, max_size=6))
    bad = draw(st.sampled_from([None, None, None, "int", "overlap", "found_inf_shape"]))
    return ts, bad


@SETTINGS
@given(unscale_lists(), st.sampled_from([1.0, 0.5, 2.0 ** -16, 0.1, 3.0]), st.sampled_from([0.0, 1.0]))
def test_unscale_against_reference(lists, inv, found0):
    ts, bad = lists
    found = torch.full((1,), found0)
    if bad == "int":
        ts = ts + [torch.ones(3, dtype=torch.int32)]
    elif bad == "overlap":
        ts = ts + [torch.ones(1).expand(4)]
    elif bad == "found_inf_shape":
        found = torch.zeros(2)
    before, found_before = snapshot(ts), found.clone()
    inv_t = torch.tensor([inv])
    if bad is not None:
        with pytest.raises((ValueError, TypeError)):
            ops.unscale_(ts, found, inv_t)
        assert_unchanged(ts, before)
        assert torch.equal(found, found_before)
        return
    ops.unscale_(ts, found, inv_t)
    any_bad = any(not torch.isfinite(b).all() for b in before)
    assert found.item() == (1.0 if any_bad or found0 else 0.0)
    for t, b in zip(ts, before):
        m = opmath(b)
        expected = (b.to(m) * torch.tensor(inv, dtype=torch.float32).to(m)).to(b.dtype)
        assert_bitwise_equal(t, expected)


@SETTINGS
@given(st.lists(tensors(), min_size=0, max_size=6))
def test_non_finite_check_reads_only(ts):
    before = snapshot(ts)
    found = torch.zeros(())
    ops.non_finite_check_(ts, found)
    assert found.item() == float(any(not torch.isfinite(b).all() for b in before))
    assert_unchanged(ts, before)


# ---- update_scale_ ------------------------------------------------------------------------

def reference_update(scale, tracker, overflows, found, growth, backoff, interval, hysteresis,
                     lo, hi):
    """torch._amp_update_scale_'s rule, with the documented hysteresis and bounds."""
    f32 = lambda x: torch.tensor(x, dtype=torch.float32).item()  # noqa: E731
    if found:
        tracker, overflows = 0, overflows + 1
        if overflows >= hysteresis:
            scale = f32(scale * backoff)
            if lo is not None and scale < f32(lo):
                scale = f32(lo)
        return scale, tracker, overflows
    overflows = 0
    if tracker + 1 == interval:
        grown = f32(scale * growth)
        if math.isfinite(grown):
            scale = min(grown, f32(hi)) if hi is not None else grown
        return scale, 0, overflows
    return scale, tracker + 1, overflows


@SETTINGS
@given(st.lists(st.booleans(), min_size=1, max_size=40), st.sampled_from([2.0, 1.5, 4.0]),
       st.sampled_from([0.5, 0.25]), st.integers(-2, 5), st.integers(1, 4),
       st.sampled_from([None, 1.0, 0.25]), st.sampled_from([None, 2.0 ** 20, 1e38]),
       st.sampled_from([1.0, 2.0 ** 16, 3e38]))
def test_update_scale_against_reference(pattern, growth, backoff, interval, hysteresis, lo, hi, init):
    if lo is not None and hi is not None and lo > hi:
        return
    scale, tracker = torch.tensor([init]), torch.zeros(1, dtype=torch.int32)
    hyst = torch.zeros(1, dtype=torch.int32)
    ref = (torch.tensor(init).item(), 0, 0)
    torch_scale, torch_tracker = torch.tensor([init]), torch.zeros(1, dtype=torch.int32)
    for found in pattern:
        f = torch.tensor([float(found)])
        ops.update_scale_(scale, tracker, f, growth, backoff, interval, hysteresis=hysteresis,
                          hysteresis_tracker=hyst, min_scale=lo, max_scale=hi)
        ref = reference_update(*ref, found, growth, backoff, interval, hysteresis, lo, hi)
        assert (scale.item(), tracker.item(), hyst.item()) == ref
        if hysteresis == 1 and lo is None and hi is None:  # the defaults are torch's own op
            torch._amp_update_scale_(torch_scale, torch_tracker, f, growth, backoff, interval)
            assert torch.equal(scale, torch_scale) and torch.equal(tracker, torch_tracker)


# ---- optimizer steps ------------------------------------------------------------------------

OPTIONS = [(e, kw) for e in OPTIMIZERS for kw in e.options]


@st.composite
def optimizer_runs(draw):
    entry, kw = draw(st.sampled_from(OPTIONS))
    n_groups = draw(st.integers(1, 3))
    groups = []
    for g in range(n_groups):
        n = draw(st.integers(1, 3))
        params = [draw(tensors(dtypes=[torch.float32, torch.float16, torch.bfloat16], max_side=12,
                               allow_special=False)) for _ in range(n)]
        groups.append((params, draw(st.sampled_from([1.0, 0.5, 0.1]))))
    master_weights = draw(st.booleans())
    scale = draw(st.sampled_from([None, 1.0, 256.0]))
    bad = draw(st.sampled_from([None] * 4 + ["state_shape", "sparse_grad", "overlap_state"]))
    bad_at = (draw(st.integers(0, n_groups - 1)), 0)
    return entry, kw, groups, master_weights, scale, bad, bad_at, draw(st.integers(0, 2 ** 16))


def one_ulp_of(t, dtype):
    return torch.finfo(dtype).eps * t.abs().clamp_min(torch.finfo(dtype).tiny)


@SETTINGS
@given(optimizer_runs())
def test_optimizer_step_against_torch(run):
    """Against torch's fused optimizer on fp32 copies fed the same unscaled grads; the tolerance
    is how far torch's own foreach implementation is from its fused one on the same run (at
    least one fp32 ulp), plus one ulp of the param dtype where half params have no master."""
    entry, kw, groups, master_weights, scale, bad, bad_at, seed = run
    gen = torch.Generator().manual_seed(seed)
    params = [[torch.nn.Parameter(p.detach().clone()) for p in ps] for ps, _ in groups]
    opt = entry.ours([{"params": ps, "lr": kw["lr"] * f} for ps, (_, f) in zip(params, groups)],
                     master_weights=master_weights, **kw)
    refs = {impl: [[torch.nn.Parameter(p.detach().float()) for p in ps] for ps in params]
            for impl in ("fused", "foreach")}  # (where torch has no fused one: its for-loop)
    ref_opts = {impl: entry.theirs([{"params": ps, "lr": kw["lr"] * f} for ps, (_, f) in zip(rs, groups)],
                                   **flags, **kw)
                for (impl, rs), flags in zip(refs.items(), torch_impls(entry.theirs))}
    flat = [p for ps in params for p in ps]
    for step in range(3):
        grads = [torch.randn(p.shape, generator=gen) for p in flat]
        for p, g in zip(flat, grads):
            p.grad = (g * (scale or 1.0)).to(p.dtype)
        inject = bad is not None and step == 2
        if inject:
            target = params[bad_at[0]][bad_at[1]]
            if bad == "sparse_grad":
                target.grad = target.grad.to_sparse()
            else:
                keys = opt._state_keys_for(next(g for g in opt.param_groups if any(q is target for q in g["params"])))
                key = keys[0] if keys else None
                if key not in opt.state[target]:  # SGD without momentum keeps no state
                    target.grad = target.grad.to_sparse()
                else:
                    overlap = bad == "overlap_state" and target.numel() > 1
                    opt.state[target][key] = (torch.zeros(1).expand(target.shape) if overlap
                                              else torch.zeros(target.numel() + 1))
            before = [t.clone() for p in flat for t in [p.detach()] + [
                v for v in opt.state[p].values() if isinstance(v, torch.Tensor)]]
        if scale is not None:
            opt.grad_scale, opt.found_inf = torch.tensor([scale]), torch.zeros(1)
        try:
            if inject:
                with pytest.raises((ValueError, TypeError)):
                    opt.step()
                after = [t for p in flat for t in [p.detach()] + [
                    v for v in opt.state[p].values() if isinstance(v, torch.Tensor)]]
                for a, b in zip(after, before):
                    assert_bitwise_equal(a, b)
                return
            opt.step()
        finally:
            for attr in ("grad_scale", "found_inf"):
                if hasattr(opt, attr):
                    delattr(opt, attr)
        for impl, rs in refs.items():
            ref_flat = [r for ps in rs for r in ps]
            for r, p in zip(ref_flat, flat):
                r.grad = p.grad.float()  # the unscaled grads our step left in p.grad
            ref_opts[impl].step()
            if not master_weights:  # half params without masters round every step
                with torch.no_grad():
                    for r, p in zip(ref_flat, flat):
                        r.copy_(r.to(p.dtype).float())
    fused = [r.detach() for ps in refs["fused"] for r in ps]
    foreach = [r.detach() for ps in refs["foreach"] for r in ps]
    for p, f, fe in zip(flat, fused, foreach):
        held = opt.state[p].get("master_param", p).detach().float()
        spread = (fe - f).abs() + one_ulp_of(f, torch.float32)
        if p.dtype != torch.float32 and "master_param" not in opt.state[p]:
            spread = spread + one_ulp_of(f, p.dtype)
        assert ((held - f).abs() <= spread).all(), ((held - f).abs() - spread).max()
        assert torch.equal(p.detach(), held.to(p.dtype))
