"""Drop-in behaviour: where a user could notice a difference from torch.optim / torch.amp, we
behave as torch does. Generic over every optimizer of optim_registry, its option sets and the
param dtypes, in the style of torch's own optimizer tests."""
import copy
import gc
import inspect
import pickle
import re
import weakref
from collections import defaultdict

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

import fused_amp
from fused_amp import ops
from fused_amp.optim import Adam, AdamW, _grad_norm, _group_lists
from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._grad_norm import local_grads
from fused_amp.optim._options import FUSED_AMP_OPTIONS
from helpers import adam_step_, assert_bitwise_equal, assert_our_keywords, sgd_step_
from optim_registry import OPTIMIZERS, PARAM_DTYPES, PLAIN, PLAIN_IDS, STATEFUL, STATEFUL_IDS, torch_impls

SHAPES = [(5, 7), (33,), (2, 3, 4)]


def make_params(dtype, shapes=SHAPES, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in shapes]


def set_grads(params, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * scale).to(p.device, p.dtype)


def value(opt, p):
    """The fp32 value an optimizer holds for ``p``: its master, or the param itself."""
    return opt.state[p].get("master_param", p).detach().float()


def tensors_of(params, opt):
    """Everything a step may change: params, and every state tensor, in a fixed order."""
    out = [p.detach().clone() for p in params]
    for p in params:
        for key in sorted(opt.state.get(p, {})):
            v = opt.state[p][key]
            if isinstance(v, torch.Tensor):
                out.append(v.clone())
    return out


def assert_all_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert_bitwise_equal(x, y)


def run_steps(opt, params, seeds):
    for seed in seeds:
        set_grads(params, seed)
        opt.step()


# ---- 1. the per-group lists follow the state and the params --------------------------------

STATE_RESETS = {
    "clear": lambda opt, params: opt.state.clear(),
    "new_defaultdict": lambda opt, params: setattr(opt, "state", defaultdict(dict)),
    "del_each": lambda opt, params: [opt.state.pop(p) for p in params],
}


@pytest.mark.parametrize("reset", list(STATE_RESETS))
@pytest.mark.parametrize("dtype", PARAM_DTYPES)
@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_state_reset_starts_afresh(cls, torch_cls, kw, dtype, reset):
    """torch re-initialises missing state: after a reset the next steps are those of a new
    optimizer started from the current params, and state_dict() has their state."""
    params = make_params(dtype)
    opt = cls(params, **kw)
    run_steps(opt, params, [1, 2])
    STATE_RESETS[reset](opt, params)
    fresh_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fresh = cls(fresh_params, **kw)
    run_steps(opt, params, [3, 4])
    run_steps(fresh, fresh_params, [3, 4])
    assert_all_equal(tensors_of(params, opt), tensors_of(fresh_params, fresh))
    assert len(opt.state_dict()["state"]) == len(params)


@pytest.mark.parametrize("entry", ["moment", "master"])
@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_replaced_state_tensor_is_used(cls, torch_cls, kw, entry):
    """A state tensor replaced between steps (a moment, or the fp32 master of a bf16 param) is
    the one the next step reads and updates, not the one the optimizer's cached lists held."""
    params = make_params(torch.bfloat16)
    opt = cls(params, **kw)
    run_steps(opt, params, [1])
    key = "master_param" if entry == "master" else first_state_key(opt, params[0])
    opt.state[params[0]][key] = torch.zeros_like(opt.state[params[0]][key])
    twin_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    twin = cls(twin_params, **kw)
    twin.load_state_dict(opt.state_dict())  # the replaced tensor is in the state dict
    run_steps(opt, params, [2])
    run_steps(twin, twin_params, [2])
    assert_all_equal(tensors_of(params, opt), tensors_of(twin_params, twin))
    assert opt.state[params[0]][key].abs().sum() > 0  # the new tensor was updated


@pytest.mark.parametrize("scaled", [False, True], ids=["no scaler", "scaler"])
@pytest.mark.parametrize("dtype", PARAM_DTYPES)
@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_the_step_keeps_no_grad_alive(cls, torch_cls, kw, dtype, scaled):
    """As with torch's optimizers, zero_grad() after a step frees the grads: the lists the
    optimizer keeps between steps hold none of them (their memory is the next backward's)."""
    for make in (lambda ps: torch_cls(ps, **kw), lambda ps: cls(ps, **kw)):
        params = make_params(dtype)
        opt = make(params)
        scaler = fused_amp.GradScaler("cpu", init_scale=4.0)
        for seed in (1, 2):  # the second step runs on the kept lists
            set_grads(params, seed)
            if scaled:
                scaler.scale(torch.ones(()))
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
        grads = [weakref.ref(p.grad) for p in params]
        opt.zero_grad()
        gc.collect()
        assert [g() for g in grads] == [None] * len(params), make(params)


@pytest.mark.parametrize("hook_kind", ["optimizer", "global"])
@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_grads_a_step_pre_hook_sets_are_the_ones_stepped(cls, torch_cls, kw, hook_kind):
    """GradScaler.step reads the grads for its overflow check and hands them to the step, which
    then reads no .grad itself; a step pre-hook may replace grads in between, and then the step
    reads the hook's, as torch's optimizers do."""
    results = []
    for hooked in (True, False):
        params = make_params(torch.bfloat16)
        opt = cls(params, **kw)
        scaler = fused_amp.GradScaler("cpu", init_scale=4.0)
        scaler.scale(torch.ones(()))
        set_grads(params, 1, 4.0)
        if hooked:
            def hook(*args):
                set_grads(params, 2, 4.0)
            handle = (opt.register_step_pre_hook(hook) if hook_kind == "optimizer"
                      else register_optimizer_step_pre_hook(hook))
        else:
            set_grads(params, 2, 4.0)
        try:
            scaler.step(opt)
        finally:
            if hooked:
                handle.remove()
        results.append(tensors_of(params, opt))
    assert_all_equal(*results)


@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_a_scaler_step_reads_the_grads_once(cls, torch_cls, kw, monkeypatch):
    """The overflow check's read of every .grad serves the step too (no hook in between)."""
    reads = []
    counted = lambda params: reads.append(len(params)) or local_grads(params)  # noqa: E731
    monkeypatch.setattr(_grad_norm, "local_grads", counted)
    monkeypatch.setattr(_group_lists, "local_grads", counted)
    params = make_params(torch.bfloat16)
    opt = cls(params, **kw)
    scaler = fused_amp.GradScaler("cpu", init_scale=4.0)
    for seed in (1, 2):
        scaler.scale(torch.ones(()))
        set_grads(params, seed, 4.0)
        scaler.step(opt)
        scaler.update()
    assert reads == [len(params)] * 2


def hyperparameters(opt, torch_cls):
    """The group options of ``torch_cls``'s own signature that shape the update: not lr (the
    scheduler tests move it) nor the implementation flags."""
    flags = {"params", "lr", "foreach", "fused", "capturable", "differentiable"}
    return [k for k in inspect.signature(torch_cls).parameters if k not in flags and k in opt.param_groups[0]]


def each_float(value, f):
    """``f`` of a float option (or of each of a pair), other options as they are."""
    if isinstance(value, tuple):
        return tuple(each_float(v, f) for v in value)
    return f(value) if isinstance(value, (float, torch.Tensor)) and not isinstance(value, bool) else value


@pytest.mark.parametrize("in_place", [False, True], ids=["set", "tensors set in place"])
@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_hyperparameters_changed_between_steps_apply_at_the_next(cls, torch_cls, kw, in_place):
    """A scheduler (OneCycleLR's cycle_momentum moves Adam's betas) or a user may change any
    hyperparameter between steps while the cached lists stay: the next step takes the new
    values, as a new optimizer loaded from the same checkpoint and set to them does. Every float
    option moves by 0.9 and ``maximize`` flips; with ``in_place``, the floats are 0-dim tensors
    (torch takes Adam's betas so) and only they change, in place: the same objects, new values."""
    params = make_params(torch.bfloat16)
    opt = cls(params, **kw)
    group, keys = opt.param_groups[0], hyperparameters(opt, torch_cls)
    if in_place:
        group.update({key: each_float(group[key], torch.tensor) for key in keys})
    run_steps(opt, params, [1, 2])
    checkpoint, start = copy.deepcopy(opt.state_dict()), [p.detach().clone() for p in params]

    def twin_step(options):
        twin_params = [torch.nn.Parameter(p.clone()) for p in start]
        twin = cls(twin_params, **kw)
        twin.load_state_dict(copy.deepcopy(checkpoint))
        twin.param_groups[0].update(options)
        run_steps(twin, twin_params, [3])
        return tensors_of(twin_params, twin)

    unmoved = twin_step({key: each_float(group[key], float) for key in keys})
    for key in keys:
        if in_place:
            each_float(group[key], lambda t: t.mul_(0.9))
        else:
            group[key] = not group[key] if key == "maximize" else each_float(group[key], lambda v: v * 0.9)
    moved = twin_step({key: each_float(group[key], float) for key in keys})
    run_steps(opt, params, [3])
    assert_all_equal(tensors_of(params, opt), moved)
    assert any(not torch.equal(a, b) for a, b in zip(moved, unmoved))  # (the change shows)


def test_a_momentum_tensor_set_from_zero_in_place_starts_the_buffer_as_torchs():
    """Which states a step keeps follows the hyperparameters' values (SGD keeps a momentum buffer
    once momentum is not 0), also when the value is a tensor set in place between steps, though
    the cached lists and the group's dict stay the same objects."""
    def run(cls):
        p = torch.nn.Parameter(torch.arange(6.0))
        opt = cls([p], lr=0.1, momentum=torch.tensor(0.0))
        for i in range(4):
            p.grad = torch.full((6,), float(i + 1))
            if i == 2:
                opt.param_groups[0]["momentum"].fill_(0.9)
            opt.step()
        return p.detach(), opt.state[p]["momentum_buffer"]

    for ours, theirs in zip(run(fused_amp.optim.SGD), run(torch.optim.SGD)):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)


@pytest.mark.parametrize("outer", [True, False], ids=["grad enabled", "under no_grad"])
@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_the_step_runs_without_grad_and_restores_the_mode_as_torchs(cls, torch_cls, kw, outer, monkeypatch):
    """As torch's step (``_use_grad_for_differentiable``): the update runs with grad disabled, the
    closure with it enabled, and the caller's grad mode comes back, after a step that raised too."""
    seen = []
    fused_step = MasterWeightOptimizer._fused_step
    monkeypatch.setattr(MasterWeightOptimizer, "_fused_step",
                        lambda self: (seen.append(torch.is_grad_enabled()), fused_step(self)))
    params = make_params(torch.float32)
    opt = cls(params, **kw)
    set_grads(params, 1)

    def closure():
        seen.append(torch.is_grad_enabled())
        return params[0].sum()

    with torch.set_grad_enabled(outer):
        opt.step(closure)
        assert torch.is_grad_enabled() is outer
        params[0].grad = params[0].grad.to_sparse()  # refused: the step raises
        with pytest.raises(ValueError, match="sparse"):
            opt.step()
        assert torch.is_grad_enabled() is outer
    assert seen == [True, False, False]


@pytest.mark.parametrize("dtype", PARAM_DTYPES)
@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_params_appended_or_replaced_in_a_group_are_updated(cls, torch_cls, kw, dtype):
    params = make_params(dtype)
    opt = cls(params[:2], **kw)
    run_steps(opt, params[:2], [1])
    opt.param_groups[0]["params"].append(params[2])
    replacement = torch.nn.Parameter(torch.randn(5, 7).to(dtype))
    old = opt.param_groups[0]["params"][0]
    opt.param_groups[0]["params"][0] = replacement
    old_before = old.detach().clone()
    group_params = opt.param_groups[0]["params"]
    before = [p.detach().clone() for p in group_params]
    set_grads(group_params + [old], 2)
    opt.step()
    for p, b in zip(group_params, before):
        assert not torch.equal(p, b), "a param of the group was not updated"
    assert torch.equal(old, old_before), "a param no longer in the group was updated"
    assert replacement in opt.state and params[2] in opt.state


# ---- 2. a failing step changes nothing ---------------------------------------------------

def first_state_key(opt, p):
    """The first per-element state of p's step (its optimizer's first state key)."""
    group = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
    return opt._state_keys_for(group)[0]


# What can reach a step wrong: torch's grad setter refuses other shapes, dtypes and devices,
# but not sparse grads, and state comes from checkpoints or user code.
BAD_INPUT = {
    "sparse_grad": lambda opt, p: setattr(p, "grad", p.grad.to_sparse()),
    "state_shape": lambda opt, p: opt.state[p].__setitem__(first_state_key(opt, p), torch.zeros(3)),
    "state_dtype": lambda opt, p: opt.state[p].__setitem__(
        first_state_key(opt, p), torch.zeros(p.shape, dtype=torch.bfloat16)),
}


@pytest.mark.parametrize("bad", list(BAD_INPUT))
@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_bad_grad_in_a_later_group_changes_nothing(cls, torch_cls, kw, bad):
    params = make_params(torch.bfloat16)
    groups = [{"params": params[:2]}, {"params": params[2:], "lr": kw["lr"] / 2}]
    opt = cls(groups, **kw)
    run_steps(opt, params, [1])
    before = tensors_of(params, opt)
    set_grads(params, 2)
    good_grad, key = params[2].grad, first_state_key(opt, params[2])
    good_state = opt.state[params[2]][key]
    BAD_INPUT[bad](opt, params[2])
    with pytest.raises((ValueError, TypeError)):
        opt.step()
    opt.state[params[2]][key] = good_state
    assert_all_equal(tensors_of(params, opt), before)
    # a retry after the fix steps every group exactly once
    params[2].grad = good_grad
    opt.step()
    twin_params = make_params(torch.bfloat16)
    twin = cls([{"params": twin_params[:2]}, {"params": twin_params[2:], "lr": kw["lr"] / 2}], **kw)
    run_steps(twin, twin_params, [1, 2])
    assert_all_equal(tensors_of(params, opt), tensors_of(twin_params, twin))


# ---- 3. p.grad after scaler.step ------------------------------------------------------------

def scaled_step(opt, params, scaler_cls, scale, seed, inf=False):
    scaler = scaler_cls("cpu", init_scale=scale)
    scaler.scale(torch.ones(()))  # creates the scale, as a scaled backward would
    set_grads(params, seed, scale=scale)
    if inf:
        params[0].grad[0] = float("inf")
    scaler.step(opt)
    scaler.update()


@pytest.mark.parametrize("scaler_cls", [fused_amp.GradScaler, torch.amp.GradScaler])
@pytest.mark.parametrize("dtype", PARAM_DTYPES)
@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_grads_are_unscaled_after_the_step_as_with_torch(cls, torch_cls, kw, dtype, scaler_cls):
    """torch's optimizers (fused or not) leave p.grad unscaled after scaler.step; so do ours,
    bitwise as torch's own GradScaler.unscale_ leaves them."""
    params = make_params(dtype)
    opt = cls(params, **kw)
    scaled_step(opt, params, scaler_cls, 1024.0, seed=1)
    expected = make_params(dtype)
    set_grads(expected, 1, scale=1024.0)
    grads = [p.grad for p in expected]
    found = torch.zeros(1)
    if dtype is torch.float16:  # torch's unscale refuses fp16; the multiply is the same
        for g in grads:
            g.copy_(g.float() * (1 / 1024.0))
    else:
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.tensor([1 / 1024.0]))
    for p, e in zip(params, expected):
        assert_bitwise_equal(p.grad, e.grad)


@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_grads_on_an_overflow_step_stay_as_torch_leaves_them(cls, torch_cls, kw):
    """torch's fused optimizers skip the whole step, grad write included, on overflow."""
    impls = [("ours", lambda ps: cls(ps, **kw)), ("torch", lambda ps: torch_cls(ps, fused=True, **kw))]
    # (torch's optimizers without a fused implementation unscale the grads before they skip:
    # the difference docs/differences.md lists)
    for impl, make in impls[:2 if torch_impls(torch_cls)[0] == dict(fused=True) else 1]:
        params = make_params(torch.float32)
        opt = make(params)
        scaled_step(opt, params, fused_amp.GradScaler, 1024.0, seed=1, inf=True)
        expected = make_params(torch.float32)
        set_grads(expected, 1, scale=1024.0)
        expected[0].grad[0] = float("inf")
        for p, e in zip(params, expected):
            assert_bitwise_equal(p.grad, e.grad, impl)


@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_unscale_grads_false_leaves_grads_scaled_and_params_the_same(cls, torch_cls, kw):
    a, b = make_params(torch.bfloat16), make_params(torch.bfloat16)
    opt_a, opt_b = cls(a, **kw), cls(b, unscale_grads=False, **kw)
    scaled_step(opt_a, a, fused_amp.GradScaler, 256.0, seed=1)
    scaled_step(opt_b, b, fused_amp.GradScaler, 256.0, seed=1)
    assert_all_equal(tensors_of(a, opt_a), tensors_of(b, opt_b))
    scaled = make_params(torch.bfloat16)
    set_grads(scaled, 1, scale=256.0)
    for p, s in zip(b, scaled):
        assert_bitwise_equal(p.grad, s.grad)


# ---- 4. values that would be narrowed or poison the params ----------------------------------

@pytest.mark.parametrize("lr", [torch.tensor(float("nan")), float("nan"), torch.tensor(-0.1)])
@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_nan_and_negative_lr_as_torch(cls, torch_cls, kw, lr):
    """Refused where torch refuses it (Adam's checks catch NaN), accepted where torch accepts it."""
    def outcome(make):
        try:
            make([torch.nn.Parameter(torch.randn(3))], lr=lr)
            return None
        except ValueError as e:
            return str(e)
    assert outcome(cls) == outcome(torch_cls)


# ---- 5. what torch accepts: layouts and integer lr ------------------------------------------

def strided_like(t, kind):
    """The same values as ``t`` in another layout."""
    if kind == "transposed":
        return t.t().contiguous().t()
    if kind == "gaps":
        base = torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype)
        view = base[:, ::2]
        view.copy_(t)
        return view
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["transposed", "gaps"])
@pytest.mark.parametrize("dtype", PARAM_DTYPES)
@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_strided_grads_give_the_same_step(cls, torch_cls, kw, dtype, kind):
    dense, strided = make_params(dtype, [(6, 5)]), make_params(dtype, [(6, 5)])
    opt_d, opt_s = cls(dense, **kw), cls(strided, **kw)
    for seed in (1, 2):
        set_grads(dense, seed, scale=64.0)
        strided[0].grad = strided_like(dense[0].grad.clone(), kind)
        grad_view = strided[0].grad
        for opt, ps in ((opt_d, dense), (opt_s, strided)):
            scaler = fused_amp.GradScaler("cpu", init_scale=64.0)
            scaler.scale(torch.ones(()))
            scaler.step(opt)
            scaler.update()
        assert strided[0].grad is grad_view  # unscaled in place, in its own layout
        assert_bitwise_equal(strided[0].grad.contiguous(), dense[0].grad)
    assert_all_equal(tensors_of(dense, opt_d), tensors_of(strided, opt_s))


@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_non_dense_param_is_updated_like_a_dense_one(cls, torch_cls, kw):
    dense = make_params(torch.bfloat16, [(6, 5)])
    strided = [torch.nn.Parameter(strided_like(dense[0].detach().clone(), "gaps"))]
    opt_d, opt_s = cls(dense, **kw), cls(strided, **kw)
    for seed in (1, 2):
        set_grads(dense, seed)
        strided[0].grad = dense[0].grad.clone()
        opt_d.step()
        opt_s.step()
    assert_bitwise_equal(strided[0].detach().contiguous(), dense[0].detach())
    assert_bitwise_equal(value(opt_s, strided[0]), value(opt_d, dense[0]))


def conv_model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 2, 1)).to(dtype)


@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_channels_last_autograd_grads_and_resume_in_another_memory_format(cls, torch_cls, kw, tmp_path):
    """Conv grads of channels_last input carry size-1 dims with other strides (autograd's own
    output), and a checkpoint saved before model.to(channels_last) loads into the new layout."""
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1)).bfloat16()

    def train(model, opt, steps, memory_format):
        for _ in range(steps):
            opt.zero_grad()
            model(x.contiguous(memory_format=memory_format)).float().square().mean().backward()
            opt.step()

    ref = conv_model(torch.bfloat16)
    ref_opt = cls(ref.parameters(), **kw)
    train(ref, ref_opt, 2, torch.contiguous_format)
    torch.save(ref_opt.state_dict(), tmp_path / "opt.pt")
    model = copy.deepcopy(ref).to(memory_format=torch.channels_last)
    opt = cls(model.parameters(), **kw)
    opt.load_state_dict(torch.load(tmp_path / "opt.pt"))
    for p in model.parameters():
        for v in opt.state[p].values():
            if v.dim() > 0:
                assert v.stride() == p.stride()
    train(ref, ref_opt, 2, torch.contiguous_format)
    train(model, opt, 2, torch.channels_last)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_integer_tensor_lr(cls, torch_cls, kw):
    a, b = make_params(torch.float32), make_params(torch.float32)
    opt_a, opt_b = cls(a, **dict(kw, lr=torch.tensor(1))), cls(b, **dict(kw, lr=1.0))
    run_steps(opt_a, a, [1])
    run_steps(opt_b, b, [1])
    assert_all_equal(tensors_of(a, opt_a), tensors_of(b, opt_b))


# ---- 6. float64 params --------------------------------------------------------------------

@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_float64_params_refused_in_the_constructor(cls, torch_cls, kw):
    torch_cls([torch.nn.Parameter(torch.randn(3, dtype=torch.float64))], **kw)  # torch takes them
    with pytest.raises(ValueError, match="param 0 of group 0 is dtype torch.float64"):
        cls([torch.nn.Parameter(torch.randn(3, dtype=torch.float64))], **kw)


# ---- 7. constructor signatures and messages ----------------------------------------------

@pytest.mark.parametrize("entry", OPTIMIZERS, ids=lambda e: e.ours.__name__)
def test_signature_is_torchs_plus_our_keywords(entry):
    assert_our_keywords(inspect.signature(entry.ours.__init__).parameters,
                        inspect.signature(entry.theirs.__init__).parameters)


def our_optimizer_classes():
    return [getattr(fused_amp.optim, name) for name in fused_amp.optim.__all__
            if isinstance(getattr(fused_amp.optim, name), type)
            and issubclass(getattr(fused_amp.optim, name), MasterWeightOptimizer)]


@pytest.mark.parametrize("cls", our_optimizer_classes(), ids=lambda c: c.__name__)
def test_the_docstring_documents_each_of_our_keywords_once_with_the_optimizers_states(cls):
    """fused_amp's options are documented once (fused_amp/optim/_options.py) and put into every
    class's Args, naming the states that the step op's table says this optimizer keeps."""
    doc = cls.__doc__
    assert "{fused_amp_options}" not in doc
    args = doc[doc.index("    Args:"):]
    for option in FUSED_AMP_OPTIONS:
        assert len(re.findall(rf"^        {option} \(", args, re.M)) == 1, (cls.__name__, option)
    for key, _, _ in fused_amp.ops.optimizers()[cls._kernel]["states"]:
        assert f"``{key}``" in args[args.index("state_dtype ("):], (cls.__name__, key)
    assert max(len(line) for line in args.splitlines()) <= 100


def test_a_users_subclass_keeps_its_own_signature():
    """Our classes take fused_amp's options as **options and show them in their signature; a
    subclass with a signature of its own (naming one of them, or *args/**kwargs) keeps it."""
    class Named(Adam):
        def __init__(self, params, lr=1e-3, master_weights=True):
            super().__init__(params, lr=lr, master_weights=master_weights)

    class Forwarding(AdamW):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)

    assert list(inspect.signature(Named).parameters) == ["params", "lr", "master_weights"]
    assert list(inspect.signature(Forwarding).parameters) == ["args", "kwargs"]
    p = torch.nn.Parameter(torch.randn(3, dtype=torch.bfloat16))
    assert Named([p], master_weights="remainder").defaults["master_weights"] == "remainder"
    assert Forwarding([p], lr=0.1, max_grad_norm=1.0).defaults["max_grad_norm"] == 1.0
    with pytest.raises(TypeError, match=r"Forwarding.__init__\(\) got an unexpected keyword argument 'foo'"):
        Forwarding([p], foo=1)


@pytest.mark.parametrize("flags", [dict(foreach=True), dict(foreach=False), dict(fused=True),
                                   dict(fused=False), dict(capturable=True)])
@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_torch_flags_accepted_and_kept_in_the_groups(cls, torch_cls, kw, flags):
    missing = [f for f in flags if f not in inspect.signature(torch_cls).parameters]
    if missing:
        pytest.skip(f"torch's optimizer has no {missing[0]} flag")
    params = make_params(torch.float32)
    opt = cls(params, **kw, **flags)
    torch_opt = torch_cls(make_params(torch.float32), **kw, **flags)
    for key, v in flags.items():
        assert opt.param_groups[0][key] == v
    assert set(torch_opt.param_groups[0]) <= set(opt.param_groups[0])
    run_steps(opt, params, [1])


@pytest.mark.parametrize("flags", [dict(differentiable=True), dict(fused=True, foreach=True)])
@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_flags_that_cannot_apply_are_refused(cls, torch_cls, kw, flags):
    missing = [f for f in flags if f not in inspect.signature(torch_cls).parameters]
    if missing:
        pytest.skip(f"torch's optimizer has no {missing[0]} flag")
    with pytest.raises(RuntimeError, match="differentiable|cannot be `True` together"):
        cls(make_params(torch.float32), **kw, **flags)


@pytest.mark.parametrize("kw", [
    dict(betas=(0.9, torch.tensor(0.99))), dict(betas=(torch.tensor(0.9), 0.99)),
    dict(lr=torch.tensor(-1e-3)), dict(lr=torch.tensor([1e-3, 1e-3])),
    dict(lr=torch.tensor(1e-3), foreach=True), dict(betas=(0.9, 1)),
])
@pytest.mark.parametrize("cls,torch_cls", [(Adam, torch.optim.Adam), (AdamW, torch.optim.AdamW)])
def test_adam_validation_messages_as_torch(cls, torch_cls, kw):
    with pytest.raises(ValueError) as theirs:
        torch_cls(make_params(torch.float32), **kw)
    with pytest.raises(ValueError) as ours:
        cls(make_params(torch.float32), **kw)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("cls,torch_cls", [(Adam, torch.optim.Adam), (AdamW, torch.optim.AdamW)])
def test_tensor_betas_are_squeezed_and_step_as_floats(cls, torch_cls):
    a, b = make_params(torch.bfloat16), make_params(torch.bfloat16)
    opt_a = cls(a, betas=(torch.tensor([0.8]), torch.tensor([[0.95]])))
    theirs = torch_cls(make_params(torch.float32), betas=(torch.tensor([0.8]), torch.tensor([[0.95]])))
    assert [t.shape for t in opt_a.param_groups[0]["betas"]] == [t.shape for t in theirs.param_groups[0]["betas"]]
    opt_b = cls(b, betas=(float(torch.tensor(0.8)), float(torch.tensor(0.95))))  # fp32 values
    run_steps(opt_a, a, [1, 2])
    run_steps(opt_b, b, [1, 2])
    assert_all_equal(tensors_of(a, opt_a), tensors_of(b, opt_b))


def test_adam_decoupled_weight_decay_is_adamw_and_survives_a_checkpoint():
    a, b, c = make_params(torch.bfloat16), make_params(torch.bfloat16), make_params(torch.bfloat16)
    opt_a = Adam(a, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True)
    opt_b = AdamW(b, lr=1e-2, weight_decay=0.1)
    run_steps(opt_a, a, [1, 2])
    run_steps(opt_b, b, [1, 2])
    assert_all_equal(tensors_of(a, opt_a), tensors_of(b, opt_b))
    # torch: an AdamW checkpoint loaded into Adam keeps decoupled decay
    torch_adamw = torch.optim.AdamW(make_params(torch.float32), lr=1e-2, weight_decay=0.1)
    opt_c = Adam(c, lr=1e-2, weight_decay=0.1)
    opt_c.load_state_dict(torch_adamw.state_dict())
    assert opt_c.param_groups[0]["decoupled_weight_decay"] is True
    torch_adam = torch.optim.Adam(make_params(torch.float32))
    torch_adam.load_state_dict(torch_adamw.state_dict())
    assert torch_adam.param_groups[0]["decoupled_weight_decay"] is True
    # and AdamW stays decoupled whatever a checkpoint says, as torch's does
    opt_b.load_state_dict(Adam(make_params(torch.bfloat16)).state_dict())
    assert opt_b.param_groups[0]["decoupled_weight_decay"] is True


# ---- 8. checkpoints -------------------------------------------------------------------------

@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_legacy_python_step_and_missing_group_options_load(cls, torch_cls, kw):
    params = make_params(torch.bfloat16)
    opt = cls(params, **kw)
    run_steps(opt, params, [1, 2])
    sd = copy.deepcopy(opt.state_dict())
    for s in sd["state"].values():
        s["step"] = float(s["step"])  # as very old torch checkpoints stored it
    for g in sd["param_groups"]:
        for key in ("maximize", "foreach", "differentiable", "fused", "capturable",
                    "decoupled_weight_decay", "unscale_grads"):
            g.pop(key, None)
    twin_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    twin = cls(twin_params, **kw)
    twin.load_state_dict(sd)
    theirs = torch_cls(make_params(torch.float32), **kw)
    theirs.load_state_dict(sd)
    for key in theirs.param_groups[0]:
        if key != "params" and key not in ("maximize",):
            assert twin.param_groups[0][key] == theirs.param_groups[0][key], key
    assert twin.param_groups[0]["maximize"] is False  # torch's default for a group lacking it
    for p in twin_params:
        assert isinstance(twin.state[p]["step"], torch.Tensor)
    if not kw.get("maximize"):
        run_steps(opt, params, [3])
        run_steps(twin, twin_params, [3])
        assert_all_equal(tensors_of(params, opt), tensors_of(twin_params, twin))


@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_load_state_dict_hooks_as_torch(cls, torch_cls, kw):
    params = make_params(torch.bfloat16)
    opt = cls(params, **kw)
    run_steps(opt, params, [1])
    sd = opt.state_dict()
    new_lr = kw["lr"] / 10
    seen = {}

    def pre_hook(optimizer, state_dict):
        out = copy.deepcopy(state_dict)
        out["param_groups"][0]["lr"] = new_lr
        return out

    def post_hook(optimizer):
        seen["dtypes"] = {v.dtype for s in optimizer.state.values() for v in s.values()
                          if isinstance(v, torch.Tensor)}
        seen["lr"] = optimizer.param_groups[0]["lr"]

    twin = cls([torch.nn.Parameter(p.detach().clone()) for p in params], **kw)
    twin.register_load_state_dict_pre_hook(pre_hook)
    twin.register_load_state_dict_post_hook(post_hook)
    twin.load_state_dict(sd)
    assert twin.param_groups[0]["lr"] == new_lr and seen["lr"] == new_lr
    assert seen["dtypes"] <= {torch.float32}  # post-hooks see the final fp32 state


# ---- 9. GradScaler ---------------------------------------------------------------------------

class OptimizerTakingTheScaler(torch.optim.SGD):
    """An optimizer of torch's older protocol: step() takes the scaler itself."""
    _step_supports_amp_scaling = True

    def step(self, closure=None, grad_scaler=None):
        self.received = grad_scaler
        return "stepped"


@pytest.mark.parametrize("scaler_cls", [torch.amp.GradScaler, fused_amp.GradScaler])
def test_step_passes_itself_to_an_optimizer_taking_grad_scaler(scaler_cls):
    p = torch.nn.Parameter(torch.randn(3))
    opt = OptimizerTakingTheScaler([p], lr=0.1)
    scaler = scaler_cls("cpu")
    scaler.scale(p.sum()).backward()
    with pytest.warns(FutureWarning, match="stop passing itself"):
        assert scaler.step(opt) == "stepped"
    assert opt.received is scaler
    assert not hasattr(opt, "grad_scale")


def test_pickle_keeps_hysteresis_progress():
    scaler = fused_amp.GradScaler("cpu", hysteresis=3)
    p = torch.nn.Parameter(torch.randn(3))
    opt = Adam([p])
    for _ in range(2):  # two overflows in a row: one short of backing off
        scaler.scale(p.sum()).backward()
        p.grad[0] = float("inf")
        scaler.step(opt)
        scaler.update()
    restored = pickle.loads(pickle.dumps(scaler))
    restored.scale(torch.ones(()))
    for s in (scaler, restored):
        p.grad = torch.full((3,), float("inf"))
        s.step(opt)
        s.update()
    assert restored.get_scale() == scaler.get_scale() == 2.0 ** 15


@pytest.mark.parametrize("kw,exc", [
    (dict(growth_interval=2.5), TypeError), (dict(growth_interval=2 ** 31), ValueError),
    (dict(hysteresis=1.5), TypeError), (dict(hysteresis=0), ValueError),
    (dict(hysteresis=2 ** 31), ValueError), (dict(min_scale=float("nan")), ValueError),
    (dict(min_scale=1e-50), ValueError), (dict(max_scale=0.0), ValueError),
    (dict(max_scale=float("nan")), ValueError), (dict(max_scale=1e39), ValueError),
    (dict(min_scale=4.0, max_scale=2.0), ValueError),
])
def test_scaler_options_update_could_not_use_are_refused_up_front(kw, exc):
    with pytest.raises(exc):
        fused_amp.GradScaler("cpu", **kw)
    scaler = fused_amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))
    sd = dict(scaler.state_dict(), **kw)
    before = scaler.state_dict()
    with pytest.raises(exc):
        scaler.load_state_dict(sd)
    assert scaler.state_dict() == before


@pytest.mark.parametrize("growth_interval", [0, -1, 1])
def test_growth_intervals_torch_accepts_behave_as_torchs(growth_interval):
    scales = []
    for scaler_cls in (torch.amp.GradScaler, fused_amp.GradScaler):
        scaler = scaler_cls("cpu", init_scale=4.0, growth_interval=growth_interval)
        p = torch.nn.Parameter(torch.randn(3))
        opt = torch.optim.SGD([p], lr=0.1)
        history = []
        for i in range(5):
            scaler.scale(p.sum()).backward()
            if i == 2:
                p.grad[0] = float("inf")
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            history.append(scaler.get_scale())
        scales.append(history)
    assert scales[0] == scales[1]


# ---- 10. op-level edges ----------------------------------------------------------------------

def adam_kwargs():
    return dict(lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0, amsgrad=False,
                maximize=False, decoupled_weight_decay=False)


def test_none_where_a_tensor_is_needed_names_the_argument():
    with pytest.raises(TypeError, match="unscale_: found_inf must be a Tensor"):
        ops.unscale_([torch.randn(3)], None, torch.ones(1))
    with pytest.raises(TypeError, match="update_scale_: scale must be a Tensor"):
        ops.update_scale_(None, torch.zeros(1, dtype=torch.int32), torch.zeros(1), 2.0, 0.5, 10)


def test_a_bare_tensor_where_a_list_is_expected_is_refused():
    x = torch.randn(3)
    with pytest.raises(TypeError, match="tensors must be a list of tensors"):
        ops.unscale_(x, torch.zeros(1), torch.ones(1))
    with pytest.raises(TypeError, match="grads must be a list of tensors"):
        adam_step_([x], x, [], [torch.zeros(3)], [torch.zeros(3)], [], [torch.zeros(())],
                       **adam_kwargs())


def test_empty_params_with_grads_is_a_length_error():
    with pytest.raises(ValueError, match="grads has 1 tensors but params has 0"):
        adam_step_([], [torch.randn(3)], [], [], [], [], [], **adam_kwargs())


@pytest.mark.parametrize("name", ["inv_scale", "found_inf", "lr_tensor"])
def test_meta_keyword_tensor_on_a_cpu_call_is_refused(name):
    params, grads = [torch.randn(3)], [torch.randn(3)]
    before = params[0].clone()
    with pytest.raises(ValueError, match=f"{name} is on meta"):
        adam_step_(params, grads, [], [torch.zeros(3)], [torch.zeros(3)], [], [torch.zeros(())],
                       **adam_kwargs(), **{name: torch.ones((), device="meta")})
    assert torch.equal(params[0], before)


def test_update_scale_bumps_the_scale_version_as_torch():
    versions = []
    for update in (torch._amp_update_scale_, ops.update_scale_):
        scale, tracker = torch.ones(()), torch.zeros((), dtype=torch.int32)
        update(scale, tracker, torch.zeros(()), 2.0, 0.5, 10)
        versions.append(scale._version)
    assert versions[0] == versions[1] == 1


def test_unscale_accepts_found_inf_that_requires_grad_and_inference_tensors():
    for make in (lambda: (torch.tensor([1.0, float("inf")]), torch.zeros(1, requires_grad=True)),):
        ours_x, ours_found = make()
        ops.unscale_([ours_x], ours_found, torch.tensor([0.5]))
        assert ours_found.item() == 1.0 and ours_x[0].item() == 0.5
    with torch.inference_mode():
        x, found, inv = torch.tensor([2.0, float("inf")]), torch.zeros(1), torch.tensor([0.5])
    ops.unscale_([x], found, inv)  # torch accepts inference tensors outside inference mode too
    assert found.item() == 1.0 and x[0].item() == 1.0


@pytest.mark.parametrize("kind", ["transposed", "gaps"])
def test_scaler_unscale_of_strided_grads_as_torch(kind):
    grads = {}
    for scaler_cls in (torch.amp.GradScaler, fused_amp.GradScaler):
        params = make_params(torch.float32, [(6, 5), (4, 3)])
        set_grads(params, 1, scale=1024.0)
        params[0].grad = strided_like(params[0].grad, kind)
        params[1].grad[1, 1] = float("inf") if scaler_cls is fused_amp.GradScaler else params[1].grad[1, 1]
        opt = torch.optim.SGD(params, lr=0.1)
        scaler = scaler_cls("cpu", init_scale=1024.0)
        scaler.scale(torch.ones(()))
        scaler.unscale_(opt)
        grads[scaler_cls] = [p.grad for p in params]
        found = sum(v.item() for v in scaler._per_optimizer_states[id(opt)]["found_inf_per_device"].values())
        assert found == (1.0 if scaler_cls is fused_amp.GradScaler else 0.0)
    for ours, theirs in zip(grads[fused_amp.GradScaler], grads[torch.amp.GradScaler]):
        assert ours.stride() == theirs.stride()
        mask = torch.isfinite(ours)
        assert_bitwise_equal(ours[mask], theirs[mask])


# ---- CUDA ---------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_cuda_step_on_the_cpu_and_grads_unscaled(cls, torch_cls, kw):
    """ZeroRedundancyOptimizer.load_state_dict moves 0-dim state (step) to the CPU; the step
    still runs on the params' device. And the grads are unscaled on CUDA as torch leaves them."""
    params = [p.cuda() for p in make_params(torch.bfloat16)]
    params = [torch.nn.Parameter(p) for p in params]
    opt = cls(params, **kw)
    run_steps(opt, params, [1])
    for p in params:
        opt.state[p]["step"] = opt.state[p]["step"].cpu()
    scaler = fused_amp.GradScaler("cuda", init_scale=512.0)
    scaler.scale(torch.ones((), device="cuda"))
    set_grads(params, 2, scale=512.0)
    expected = [p.grad.clone() for p in params]
    torch._amp_foreach_non_finite_check_and_unscale_(
        expected, torch.zeros(1, device="cuda"), torch.full((1,), 1 / 512.0, device="cuda"))
    scaler.step(opt)
    scaler.update()
    for p, e in zip(params, expected):
        assert opt.state[p]["step"].device == p.device and opt.state[p]["step"].item() == 2.0
        assert_bitwise_equal(p.grad, e)


def test_a_step_with_every_list_empty_is_a_no_op():
    """As torch's foreach ops accept empty lists (the dispatcher alone would find no kernel)."""
    adam_step_([], [], [], [], [], [], [], lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                   amsgrad=False, maximize=False, decoupled_weight_decay=False)
    sgd_step_([], [], [], [], [], lr=1e-3, momentum=0.9, dampening=0.0, weight_decay=0.0,
                  nesterov=False, maximize=False)
    with pytest.raises(ValueError, match=r"step_\(sgd\): grads has 1 tensors but params has 0"):
        sgd_step_([], [torch.zeros(2)], [], [], [], lr=1e-3, momentum=0.0, dampening=0.0,
                      weight_decay=0.0, nesterov=False, maximize=False)


@pytest.mark.parametrize("cls,torch_cls", [(Adam, torch.optim.Adam), (AdamW, torch.optim.AdamW)])
def test_more_than_two_betas_are_taken_as_torch_takes_them(cls, torch_cls):
    """torch 2.14 keeps the first two betas of a longer tuple; so do we, and both step alike."""
    ours, theirs = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt, ref = cls([ours], betas=(0.8, 0.99, 0.5)), torch_cls([theirs], betas=(0.8, 0.99, 0.5))
    assert opt.param_groups[0]["betas"] == ref.param_groups[0]["betas"]
    for p, o in ((ours, opt), (theirs, ref)):
        p.grad = torch.full((3,), 0.5)
        o.step()
    torch.testing.assert_close(ours.detach(), theirs.detach())


# ---- autograd's safety net: version counters ---------------------------------------------------

@pytest.mark.parametrize("dtype", PARAM_DTYPES, ids=str)
@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_a_param_saved_for_backward_then_stepped_raises_as_in_torch(cls, torch_cls, kw, dtype):
    """torch's default (for-loop) optimizers bump the version of what a step writes, so autograd
    refuses a backward through a param the step changed; ours too, also for a step that an
    overflow skipped on the device (the host cannot tell), and the grads the scaler unscaled."""
    for make in (lambda ps: torch_cls(ps, **kw), lambda ps: cls(ps, **kw)):
        params = make_params(dtype)
        opt = make(params)
        set_grads(params, 0)
        y = sum((p * p).float().sum() for p in params)  # mul saves p itself
        opt.step()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()
    params = make_params(dtype)
    opt, scaler = cls(params, **kw), fused_amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale(torch.ones(()))
    set_grads(params, 1, 4.0)
    params[0].grad[0] = float("inf")
    before = [(p._version, p.grad._version) for p in params]
    state_before = {k: v._version for p in params for k, v in opt.state[p].items()}
    scaler.step(opt)
    scaler.update()
    assert all(p._version > v for p, (v, _) in zip(params, before))  # skipped, bumped all the same
    assert all(p.grad._version > g for p, (_, g) in zip(params, before)) or not opt.defaults["unscale_grads"]
    assert all(v._version > state_before.get(k, -1) for p in params for k, v in opt.state[p].items()
               if k in state_before)


def test_unscale_leaves_the_versions_as_torchs_op_leaves_them():
    """torch's unscale op (and its fused optimizers) bump nothing; ours neither."""
    grads, found = [torch.randn(5), torch.randn(3).bfloat16()], torch.zeros(())
    theirs, their_found = [g.clone() for g in grads], torch.zeros(())
    ops.unscale_(grads, found, torch.tensor(0.5))
    torch._amp_foreach_non_finite_check_and_unscale_(theirs, their_found, torch.tensor(0.5))
    assert [g._version for g in grads] + [found._version] == [t._version for t in theirs] + [their_found._version]
