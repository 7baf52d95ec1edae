"""fused_amp.GradScaler against torch.amp.GradScaler, and its additions."""
import pickle
import warnings

import pytest
import torch

import fused_amp
from fused_amp import GradScaler
from helpers import assert_bitwise_equal

OVERFLOW_STEPS = {0: "inf", 1: "nan", 5: "-inf", 9: "inf", 10: "nan"}
OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adam_fused": lambda ps: torch.optim.Adam(ps, lr=1e-2, fused=True),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True),
    "fused_amp_adam": lambda ps: fused_amp.optim.Adam(ps, lr=1e-2),
}


def make_model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(), torch.nn.Linear(24, 3)).to(dtype)


def train(scaler_cls, opt_name, clip, steps=16, dtype=torch.float32):
    model = make_model(dtype)
    opt = OPTIMIZERS[opt_name](model.parameters())
    scaler = scaler_cls("cpu", init_scale=2.0 ** 10, growth_interval=3)
    gen = torch.Generator().manual_seed(1)
    history = []
    for step in range(steps):
        x = torch.randn(16, 12, generator=gen).to(dtype)
        opt.zero_grad()
        loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        if step in OVERFLOW_STEPS:
            model[step % 2 * 2].weight.grad[0, 1] = float(OVERFLOW_STEPS[step])
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        history.append((scaler.get_scale(), [p.detach().clone() for p in model.parameters()]))
    return history


@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("opt_name", ["sgd_momentum", "adam_fused", "adamw_foreach"])
def test_parity_with_torch_grad_scaler(opt_name, clip):
    ours = train(GradScaler, opt_name, clip)
    theirs = train(torch.amp.GradScaler, opt_name, clip)
    for step, ((scale_a, params_a), (scale_b, params_b)) in enumerate(zip(ours, theirs)):
        assert scale_a == scale_b, f"scale differs after step {step}"
        for a, b in zip(params_a, params_b):
            assert_bitwise_equal(a, b, f"step {step}")
    # overflow steps were skipped: the weights did not move there
    for step in OVERFLOW_STEPS:
        if step > 0:
            for a, b in zip(ours[step][1], ours[step - 1][1]):
                assert torch.equal(a, b)


@pytest.mark.parametrize("clip", [False, True])
def test_fused_amp_optimizer_skips_on_device_like_torch_skips(clip):
    # the same run with bf16 params, fused_amp's Adam: overflow steps change nothing
    hist = train(GradScaler, "fused_amp_adam", clip, dtype=torch.bfloat16)
    for step in OVERFLOW_STEPS:
        if step > 0:
            for a, b in zip(hist[step][1], hist[step - 1][1]):
                assert torch.equal(a, b)
    assert hist[-1][0] == train(torch.amp.GradScaler, "adam_fused", clip)[-1][0]


def test_optimizer_step_always_called_so_schedulers_do_not_warn():
    model = make_model(torch.bfloat16)
    opt = fused_amp.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    scaler = GradScaler("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            scaler.scale(model(torch.randn(4, 12).bfloat16()).float().sum()).backward()
            model[0].weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
            sched.step()


def test_step_returns_optimizer_result_and_passes_arguments():
    class Recording(torch.optim.SGD):
        def step(self, closure=None, *, tag=None):
            super().step()
            return ("stepped", tag)

    for opt_cls in (Recording,):
        model = make_model()
        opt = opt_cls(model.parameters(), lr=0.1)
        scaler = GradScaler("cpu")
        scaler.scale(model(torch.randn(2, 12)).sum()).backward()
        assert scaler.step(opt, tag=7) == ("stepped", 7)
        scaler.update()


def misuse_error(scaler_cls, action):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = scaler_cls("cpu")
    scaler.scale(model(torch.randn(2, 12)).sum()).backward()
    with pytest.raises(Exception) as info:
        action(scaler, opt)
    return type(info.value), str(info.value)


@pytest.mark.parametrize("name,action", [
    ("unscale twice", lambda s, o: (s.unscale_(o), s.unscale_(o))),
    ("unscale after step", lambda s, o: (s.step(o), s.unscale_(o))),
    ("step twice", lambda s, o: (s.step(o), s.step(o))),
    ("closure", lambda s, o: s.step(o, closure=lambda: 0)),
    ("update without checks", lambda s, o: s.update()),
    ("load empty state dict", lambda s, o: s.load_state_dict({})),
    ("pickle mid-iteration", lambda s, o: (s.step(o), pickle.dumps(s))),
])
def test_misuse_errors_match_torch(name, action):
    assert misuse_error(GradScaler, action) == misuse_error(torch.amp.GradScaler, action)


def test_misuse_errors_match_torch_with_fused_optimizer():
    def both(action):
        out = []
        for cls, opt_cls in ((GradScaler, fused_amp.optim.Adam),
                             (torch.amp.GradScaler, lambda ps: torch.optim.Adam(ps, fused=True))):
            model = make_model()
            opt, scaler = opt_cls(model.parameters()), cls("cpu")
            scaler.scale(model(torch.randn(2, 12)).sum()).backward()
            with pytest.raises(Exception) as info:
                action(scaler, opt)
            out.append((type(info.value), str(info.value)))
        return out

    a, b = both(lambda s, o: (s.step(o), s.step(o)))
    assert a == b


def test_state_dicts_load_both_ways():
    ours, theirs = GradScaler("cpu", init_scale=8.0, growth_interval=5), torch.amp.GradScaler(
        "cpu", init_scale=4.0, growth_interval=7)
    for s in (ours, theirs):
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            s.scale(model(torch.randn(2, 12)).sum()).backward()
            s.step(opt)
            s.update()
    assert set(theirs.state_dict()) <= set(ours.state_dict())
    into_ours, into_theirs = GradScaler("cpu"), torch.amp.GradScaler("cpu")
    into_ours.load_state_dict(theirs.state_dict())
    into_theirs.load_state_dict(ours.state_dict())
    assert into_ours.state_dict() == {**theirs.state_dict(), "hysteresis": 1, "min_scale": None,
                                      "max_scale": None, "_hysteresis_tracker": 0}
    assert into_theirs.state_dict() == {k: v for k, v in ours.state_dict().items()
                                        if k in theirs.state_dict()}


def test_pickle_at_allowed_points():
    scaler = GradScaler("cpu", hysteresis=2, min_scale=1.0)
    assert pickle.loads(pickle.dumps(scaler)).state_dict() == scaler.state_dict()
    model = make_model()
    opt = fused_amp.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.randn(2, 12)).sum()).backward()
    scaler.step(opt)
    scaler.update()
    restored = pickle.loads(pickle.dumps(scaler))
    assert restored.state_dict() == scaler.state_dict()


def test_disabled_scaler_is_a_pass_through():
    scaler = GradScaler("cpu", enabled=False)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(2, 12)).sum()
    assert scaler.scale(loss) is loss
    loss.backward()
    before = [p.clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    assert scaler.state_dict() == {} and not scaler.is_enabled() and scaler.get_scale() == 1.0
    assert not torch.equal(before[0], model[0].weight)


def test_cuda_requested_without_cuda_warns_and_disables():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.warns(UserWarning, match="CUDA is not available"):
        scaler = GradScaler()
    assert not scaler.is_enabled()


def test_scale_nested_outputs_and_getters():
    scaler = GradScaler("cpu", init_scale=4.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=9)
    a, b = torch.ones(2), torch.ones(3)
    out = scaler.scale([a, (b, [a])])
    assert torch.equal(out[0], 4 * a) and torch.equal(out[1][0], 4 * b) and isinstance(out[1], tuple)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()) == (3.0, 0.25, 9)
    scaler.set_growth_factor(2.0)
    scaler.set_backoff_factor(0.5)
    scaler.set_growth_interval(3)
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()) == (2.0, 0.5, 3)


@pytest.mark.parametrize("new_scale", [512.0, torch.tensor(512.0)])
def test_update_with_new_scale(new_scale):
    scaler = GradScaler("cpu")
    scaler.scale(torch.ones(1))
    scaler.update(new_scale)
    assert scaler.get_scale() == 512.0


def test_fp16_grads_unscaled():
    model = make_model(torch.float16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu", init_scale=64.0)
    scaler.scale(model(torch.randn(2, 12).half()).float().sum()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    scaler.unscale_(opt)  # torch.amp.GradScaler raises "Attempting to unscale FP16 gradients."
    for p, g in zip(model.parameters(), grads):
        assert torch.equal(p.grad, (g.float() / 64).half())


def test_found_inf_of_several_devices_is_one_not_a_sum():
    scaler = GradScaler("cpu")
    combined = scaler._combined_found_inf([torch.ones(()), torch.ones(()), torch.zeros(())],
                                          torch.device("cpu"))
    assert combined.item() == 1.0


def run_sequence(scaler, overflows):
    model = make_model()
    opt = fused_amp.optim.SGD(model.parameters(), lr=0.01)
    scales = []
    for inf in overflows:
        opt.zero_grad()
        scaler.scale(model(torch.randn(2, 12)).sum()).backward()
        if inf:
            model[0].weight.grad[0, 0] = float("nan")
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def test_hysteresis_in_the_scaler():
    scaler = GradScaler("cpu", init_scale=64.0, growth_interval=100, hysteresis=2)
    assert run_sequence(scaler, [1, 0, 1, 1, 1, 0]) == [64, 64, 64, 32, 16, 16]


def test_min_scale_stops_the_fall_and_warns_once():
    scaler = GradScaler("cpu", init_scale=8.0, min_scale=1.0)
    with pytest.warns(UserWarning, match="min_scale=1.0") as record:
        scales = run_sequence(scaler, [1] * 8)
    assert scales == [4, 2, 1, 1, 1, 1, 1, 1]
    assert sum("min_scale" in str(w.message) for w in record) == 1


def test_max_scale_bounds_growth():
    scaler = GradScaler("cpu", init_scale=8.0, growth_interval=1, max_scale=20.0)
    assert run_sequence(scaler, [0] * 4) == [16, 20, 20, 20]


def test_overflow_report_names_the_parameter():
    model = make_model()
    opt = fused_amp.optim.Adam(model.parameters(), lr=0.01)
    scaler = GradScaler("cpu", track_overflows=True)
    scaler.watch(model)
    gen = torch.Generator().manual_seed(0)
    for step in range(5):
        opt.zero_grad()
        scaler.scale(model(torch.randn(2, 12, generator=gen)).sum()).backward()
        if step in (1, 3):
            model[2].bias.grad[1] = float("inf")
        scaler.step(opt)
        scaler.update()
    report = scaler.overflow_report()
    assert report.skipped_steps == 2
    assert report.last_overflow_params == ["2.bias"]
    assert "2.bias" in str(report)


def test_overflow_report_needs_tracking():
    with pytest.raises(RuntimeError, match="track_overflows=True"):
        GradScaler("cpu").overflow_report()


def test_seed_recipe_runs_by_changing_only_the_import():
    """The AMP recipe on CPU (autocast bf16), with a stock optimizer and with ours."""
    for make_opt in (lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                     lambda ps: fused_amp.optim.AdamW(ps, lr=1e-3)):
        model = make_model()
        optimizer = make_opt(model.parameters())
        scaler = fused_amp.GradScaler("cpu")
        for _ in range(3):
            optimizer.zero_grad()
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(8, 12)).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        assert torch.isfinite(loss)


# ---- CUDA ---------------------------------------------------------------------------------

def test_sparse_grads_unscaled_like_torch():
    def run(scaler_cls):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(50, 8, sparse=True)
        opt = torch.optim.SGD(emb.parameters(), lr=0.1)
        scaler = scaler_cls("cpu", init_scale=256.0)
        for step in range(3):
            opt.zero_grad()
            scaler.scale(emb(torch.tensor([[1, 2, 3, 2]]) + step).pow(2).sum()).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        return emb.weight.detach().clone(), scaler.get_scale()

    (ours, ours_scale), (theirs, theirs_scale) = run(GradScaler), run(torch.amp.GradScaler)
    assert_bitwise_equal(ours, theirs)
    assert ours_scale == theirs_scale


@pytest.mark.parametrize("skip_on_host", [False, True])
def test_skip_on_host_does_not_call_the_step_on_overflow(skip_on_host):
    """skip_on_host: the scaler decides on the host and leaves step() uncalled on an overflow
    (what accelerate watches); otherwise the step is called and skips on the device. Either
    way nothing changes, and a clip taken for the skipped step is not carried to the next."""
    p = torch.nn.Parameter(torch.zeros(4).bfloat16())
    opt = fused_amp.optim.SGD([p], lr=1.0)
    calls = []
    real_step = opt.step
    opt.step = lambda *a, **k: (calls.append(1), real_step(*a, **k))[1]
    scaler = fused_amp.GradScaler("cpu", init_scale=4.0, skip_on_host=skip_on_host)
    scaler.scale(torch.ones(()))
    p.grad = torch.tensor([1.0, float("inf"), 0.0, 0.0]).bfloat16()
    opt.clip_grad_norm_(1.0)
    scaler.step(opt)
    scaler.update()
    assert len(calls) == (0 if skip_on_host else 1)
    assert torch.equal(p.detach(), torch.zeros(4).bfloat16()) and scaler.get_scale() == 2.0
    p.grad = torch.full((4,), 0.5).bfloat16() * 2.0  # scaled by the new scale: unscaled 0.5
    scaler.scale(torch.ones(()))
    scaler.step(opt)  # no clip pending: a plain step
    assert torch.equal(p.detach(), torch.full((4,), -0.5).bfloat16())
