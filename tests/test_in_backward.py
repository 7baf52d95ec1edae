"""fused_amp.optim.step_in_backward: every param steps inside backward as its grad arrives and its
grad is freed; params, masters and state end bit for bit where the normal loop leaves them, for
every optimizer of the registry and every memory mode; what cannot be done in backward is
refused before anything changes."""
import pytest
import torch

import fused_amp
from fused_amp.optim import in_backward, step_in_backward
from helpers import assert_bitwise_equal
from optim_registry import PLAIN, PLAIN_IDS, STATEFUL, STATEFUL_IDS

MODES = [dict(master_weights=True), dict(master_weights="remainder"), dict(master_weights="remainder8"),
         dict(master_weights=False), dict(master_weights=True, state_dtype=torch.bfloat16),
         dict(master_weights="remainder8", state_dtype=torch.uint8, min_8bit_size=256)]
MODE_IDS = ["fp32-masters", "remainder", "remainder8", "no-masters", "bf16-state", "remainder8-8bit"]


@pytest.fixture(autouse=True)
def no_handle_left_in_force():
    """A handle left in force would make every fused_amp.GradScaler of the process refuse to scale."""
    yield
    assert not in_backward.any_active()


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                               torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).bfloat16()


def batch(step):
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(12, 16, generator=gen).bfloat16()


def train(model, opt, steps, in_backward, bucket_bytes=None):
    """The normal loop; with ``in_backward`` the same loop, unchanged, under step_in_backward
    (its step() and zero_grad() do nothing). An LR schedule changes lr at every step."""
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (1 + 0.1 * t))
    handle = step_in_backward(opt, bucket_bytes) if in_backward else None
    for step in range(steps):
        model(batch(step)).float().pow(2).mean().backward()
        if in_backward:
            assert all(p.grad is None for p in model.parameters())  # stepped and freed
        opt.step()
        sched.step()
        opt.zero_grad()
    if handle is not None:
        handle.remove()


def assert_same_run(model, opt, ref_model, ref):
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert_bitwise_equal(p.detach(), q.detach(), "param")
        for key, value in ref.state[q].items():
            if isinstance(value, torch.Tensor):
                assert_bitwise_equal(opt.state[p][key], value, key)


def runs(cls, kw, mode, bucket_bytes=None, steps=20):
    model, ref_model = make_model(), make_model()
    opt, ref = cls(model.parameters(), **kw, **mode), cls(ref_model.parameters(), **kw, **mode)
    train(model, opt, steps, True, bucket_bytes)
    train(ref_model, ref, steps, False)
    return model, opt, ref_model, ref


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_every_optimizer_and_memory_mode_steps_as_the_normal_loop_bitwise(cls, torch_cls, kw, mode):
    bucket = 0 if MODES.index(mode) % 2 else None  # every param alone, or the default buckets
    assert_same_run(*runs(cls, kw, mode, bucket))


@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_every_optimizers_stateful_options_step_as_the_normal_loop_bitwise(cls, torch_cls, kw):
    assert_same_run(*runs(cls, kw, dict(master_weights="remainder"), 1 << 12))


@pytest.mark.parametrize("bucket_bytes", [0, None])
def test_muon_steps_in_backward_as_the_normal_loop(bucket_bytes):
    """Muon (2-D params; Newton-Schulz batched per shape within each bucket's step)."""
    def muon_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 64, bias=False), torch.nn.GELU(),
                                   torch.nn.Linear(64, 64, bias=False), torch.nn.GELU(),
                                   torch.nn.Linear(64, 8, bias=False)).bfloat16()
    model, ref_model = muon_model(), muon_model()
    opt = fused_amp.optim.Muon(model.parameters(), lr=1e-2, master_weights="remainder")
    ref = fused_amp.optim.Muon(ref_model.parameters(), lr=1e-2, master_weights="remainder")
    train(model, opt, 6, True, bucket_bytes)
    train(ref_model, ref, 6, False)
    assert_same_run(model, opt, ref_model, ref)


@pytest.mark.parametrize("bucket_bytes", [0, None])
def test_gradient_accumulation_under_no_step_is_the_normal_loops(bucket_bytes):
    """(every param alone: a param steps with this backward's whole grad while the others'
    still hold the accumulated part only)"""
    model, ref_model = make_model(), make_model()
    opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-2)
    ref = fused_amp.optim.AdamW(ref_model.parameters(), lr=1e-2)
    handle = step_in_backward(opt, bucket_bytes)
    for step in range(4):
        with handle.no_step():
            model(batch(2 * step)).float().pow(2).mean().backward()
        assert all(p.grad is not None for p in model.parameters())  # held, as without the handle
        model(batch(2 * step + 1)).float().pow(2).mean().backward()
        for s in (2 * step, 2 * step + 1):
            ref_model(batch(s)).float().pow(2).mean().backward()
        ref.step()
        ref.zero_grad()
    handle.remove()
    assert_same_run(model, opt, ref_model, ref)
    assert all(v["step"].item() == 4 for v in opt.state.values())


def test_remove_restores_the_normal_loop_and_state_dict_works_throughout():
    model, ref_model = make_model(), make_model()
    opt = fused_amp.optim.Adam(model.parameters(), lr=1e-2)
    ref = fused_amp.optim.Adam(ref_model.parameters(), lr=1e-2)
    train(model, opt, 3, True)  # (removes its handle at the end)
    train(ref_model, ref, 3, False)
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())
    saved = opt.state_dict()
    opt.load_state_dict(saved)
    train(model, opt, 3, False)  # the normal loop again: step() steps
    train(ref_model, ref, 3, False)
    assert_same_run(model, opt, ref_model, ref)


def test_a_compiled_models_backward_steps_in_backward():
    model, ref_model = make_model(), make_model()
    opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-2, master_weights="remainder")
    ref = fused_amp.optim.AdamW(ref_model.parameters(), lr=1e-2, master_weights="remainder")
    train(torch.compile(model, backend="aot_eager"), opt, 4, True)
    train(torch.compile(ref_model, backend="aot_eager"), ref, 4, False)
    assert_same_run(model, opt, ref_model, ref)
    assert all(v["step"].item() == 4 for v in opt.state.values())


def test_what_needs_every_grad_is_refused_before_anything_changes():
    model = make_model()
    params = list(model.parameters())
    with pytest.raises(ValueError, match=r"max_grad_norm=1.0; clipping by the global grad norm needs every grad"):
        step_in_backward(fused_amp.optim.AdamW(params, max_grad_norm=1.0))
    with pytest.raises(ValueError, match=r"param 0 of group 0 is float16; fp16 training needs a GradScaler"):
        step_in_backward(fused_amp.optim.AdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))]))
    with pytest.raises(TypeError, match="torch.optim.adamw.AdamW is not a fused_amp.optim optimizer"):
        step_in_backward(torch.optim.AdamW(params))
    with pytest.raises(ValueError, match="bucket_bytes must be >= 0"):
        step_in_backward(fused_amp.optim.AdamW(params), bucket_bytes=-1)
    assert all(not p._post_accumulate_grad_hooks for p in params)  # nothing registered
    opt = fused_amp.optim.AdamW(params, lr=1e-2)
    handle = step_in_backward(opt)
    with pytest.raises(RuntimeError, match="already steps in backward"):
        step_in_backward(opt)
    before = [p.detach().clone() for p in params]
    with pytest.raises(RuntimeError, match="GradScaler: a fused_amp.optim optimizer steps in backward"):
        fused_amp.GradScaler("cpu").scale(model(batch(0)).float().sum())
    model(batch(0)).float().sum().backward()
    with pytest.raises(RuntimeError, match=r"clip_grad_norm_: AdamW steps in backward"):
        opt.clip_grad_norm_(1.0)
    with pytest.raises(RuntimeError, match="got a sparse grad"):
        emb = torch.nn.Embedding(10, 4, sparse=True)
        sparse_opt = fused_amp.optim.SGD(emb.parameters(), lr=0.1)
        h = step_in_backward(sparse_opt)
        try:
            emb(torch.tensor([1, 2])).sum().backward()
        finally:
            h.remove()
    handle.remove()
    assert not all(torch.equal(p.detach(), b) for p, b in zip(params, before))  # the backward stepped


def test_a_copy_of_an_optimizer_in_backward_steps_in_the_normal_loop():
    """torch pickles an optimizer's defaults, state and groups only: a copy of one that steps in
    backward is not in backward (no hook steps it), so its step() steps, as the original's
    normal loop does once its handle is removed."""
    import copy

    model, ref_model = make_model(), make_model()
    opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-2)
    ref = fused_amp.optim.AdamW(ref_model.parameters(), lr=1e-2)
    handle = step_in_backward(opt)
    twin = copy.deepcopy(opt)
    handle.remove()
    twin_params = [p for group in twin.param_groups for p in group["params"]]
    for p, q in zip(twin_params, model.parameters()):
        p.grad = torch.ones_like(q)
    for q in ref_model.parameters():
        q.grad = torch.ones_like(q)
    twin.step()
    ref.step()
    for p, q in zip(twin_params, ref_model.parameters()):
        assert_bitwise_equal(p.detach(), q.detach(), "param")
