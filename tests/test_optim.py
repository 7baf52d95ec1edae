"""fused_amp.optim: parity with torch.optim, masters, overflow, checkpoints, schedulers."""
import copy
import math
import warnings

import pytest
import torch

import fused_amp
from fused_amp.optim import SGD, Adam, AdamW, export_fp32
from helpers import assert_bitwise_equal, adam_step_, sgd_step_
from optim_registry import CASES, IDS, torch_impls

SHAPES = [(64, 33), (1000,), (7,), (3, 5, 9), (1,)]


def groups_of(params, kw):
    """Two param groups; the second with its own lr, to exercise per-group hyperparameters."""
    return [{"params": params[:3]}, {"params": params[3:], "lr": kw["lr"] * 0.5}]


def run_parity(cls, torch_cls, kw, dtype, device, steps=120):
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    ours = [torch.nn.Parameter(x.to(device, dtype)) for x in init]
    ref_init = [p.detach().float() for p in ours]
    fused = [torch.nn.Parameter(x.clone()) for x in ref_init]
    foreach = [torch.nn.Parameter(x.clone()) for x in ref_init]
    opt = cls(groups_of(ours, kw), **kw)
    reference, other = torch_impls(torch_cls)  # fused and foreach, or for-loop and foreach
    opt_fused = torch_cls(groups_of(fused, kw), **reference, **kw)
    opt_foreach = torch_cls(groups_of(foreach, kw), **other, **kw)
    for _ in range(steps):
        grads = [torch.randn(s, generator=gen).to(device, dtype) for s in SHAPES]
        for p, g in zip(ours, grads):
            p.grad = g
        for params in (fused, foreach):
            for p, g in zip(params, grads):
                p.grad = g.float()  # the same gradients, as the fp32 runs see them
        opt.step()
        opt_fused.step()
        opt_foreach.step()
        for p in ours:
            master = opt.state[p]["master_param"] if dtype != torch.float32 else p
            assert torch.equal(p, master.to(dtype)), "param != master.to(dtype)"
    value = lambda p: opt.state[p]["master_param"] if dtype != torch.float32 else p  # noqa: E731
    ours_flat = torch.cat([value(p).detach().flatten() for p in ours])
    fused_flat = torch.cat([p.detach().flatten() for p in fused])
    foreach_flat = torch.cat([p.detach().flatten() for p in foreach])
    return ours_flat, fused_flat, foreach_flat


def one_ulp(values):
    """One fp32 ulp at the largest magnitude of ``values``, taken in its binade's upper
    neighbour: a value just below a power of two and one just above it differ by one ulp of the
    upper binade."""
    top = values.abs().max().item()
    return torch.finfo(torch.float32).eps * 2.0 ** math.ceil(math.log2(top)) if top > 0 else 0.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_parity_with_torch_fused(cls, torch_cls, kw, dtype):
    """Our fp32 masters end no further from torch's fused optimizer (on fp32 copies fed the
    same grads) than torch's foreach implementation ends from it, after 120 steps."""
    ours, fused, foreach = run_parity(cls, torch_cls, kw, dtype, "cpu")
    torch_spread = (foreach - fused).abs().max().item()
    ours_distance = (ours - fused).abs().max().item()
    assert ours_distance <= max(torch_spread, one_ulp(fused)), (ours_distance, torch_spread)


def test_adam_fp32_params_bitwise_equal_to_torch_fused_cpu():
    ours, fused, _ = run_parity(Adam, torch.optim.Adam, dict(lr=1e-3), torch.float32, "cpu", 50)
    assert_bitwise_equal(ours, fused)


def make_model(dtype=torch.bfloat16):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(dtype)


def train(model, opt, steps, seed=1, scheduler=None):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen).to(next(model.parameters()).dtype)
        opt.zero_grad()
        model(x).float().pow(2).mean().backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


def snapshot(model, opt):
    return [t.clone() for t in model.parameters()] + [
        v.clone() for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("cls,kw", [(Adam, dict(lr=1e-2, amsgrad=True)), (AdamW, {}),
                                    (SGD, dict(lr=0.1, momentum=0.9))])
def test_overflow_step_changes_nothing(cls, kw):
    model = make_model()
    opt = cls(model.parameters(), **kw)
    train(model, opt, 3)
    before = snapshot(model, opt)
    x = torch.randn(8, 16).bfloat16()
    model(x).float().sum().backward()
    next(model.parameters()).grad[0, 0] = float("inf")
    opt.grad_scale, opt.found_inf = torch.tensor([1024.0]), torch.ones(1)  # as a GradScaler sets them
    opt.step()
    del opt.grad_scale, opt.found_inf
    for a, b in zip(snapshot(model, opt), before):
        assert_bitwise_equal(a, b)


def test_sgd_first_step_skipped_still_starts_buffer_from_grad():
    model, ref = make_model(), make_model()
    opt, ref_opt = SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5), SGD(
        ref.parameters(), lr=0.1, momentum=0.9, dampening=0.5)
    x = torch.randn(8, 16).bfloat16()
    model(x).float().sum().backward()
    opt.found_inf = torch.ones(1)
    opt.step()  # skipped
    del opt.found_inf
    train(model, opt, 3)
    train(ref, ref_opt, 3)
    for a, b in zip(model.parameters(), ref.parameters()):
        assert_bitwise_equal(a, b)


def test_grad_scale_is_applied_inside_the_step():
    scaled, plain = make_model(), make_model()
    opt_s, opt_p = Adam(scaled.parameters(), lr=1e-2), Adam(plain.parameters(), lr=1e-2)
    x = torch.randn(8, 16).bfloat16()
    (scaled(x).float().sum() * 256).backward()
    plain(x).float().sum().backward()
    for p in scaled.parameters():  # the scaled grads, as backward of a scaled loss gives them
        p.grad = (p.grad.float()).bfloat16()
    for ps, pp in zip(scaled.parameters(), plain.parameters()):
        pp.grad = (ps.grad.float() / 256).bfloat16()
    opt_s.grad_scale, opt_s.found_inf = torch.tensor([256.0]), torch.zeros(1)
    opt_s.step()
    opt_p.step()
    for a, b in zip(scaled.parameters(), plain.parameters()):
        assert_bitwise_equal(a, b)


def test_master_weights_false_updates_half_params_in_place():
    model = make_model(torch.float16)
    opt = Adam(model.parameters(), lr=1e-2, master_weights=False)
    before = [p.clone() for p in model.parameters()]
    train(model, opt, 2)
    for p, b in zip(model.parameters(), before):
        assert "master_param" not in opt.state[p]
        assert opt.state[p]["exp_avg"].dtype == torch.float32
        assert not torch.equal(p, b)


def test_fp32_params_have_no_master_and_mixed_dtypes_in_one_group():
    params = [param_with_grad(torch.randn(4, 4), torch.float32),
              param_with_grad(torch.randn(4, 4).bfloat16()),
              param_with_grad(torch.randn(4, 4).half(), torch.float16)]
    refs = [torch.nn.Parameter(p.detach().float()) for p in params]
    for r, p in zip(refs, params):
        r.grad = p.grad.float()
    torch.optim.Adam(refs, lr=1e-2, fused=True).step()
    opt = Adam(params, lr=1e-2)
    opt.step()
    assert "master_param" not in opt.state[params[0]]
    assert_bitwise_equal(params[0].detach(), refs[0].detach())
    for p, r in zip(params[1:], refs[1:]):
        assert_bitwise_equal(opt.state[p]["master_param"], r.detach())
        assert torch.equal(p, r.detach().to(p.dtype))


def test_params_without_grad_are_skipped():
    model = make_model()
    opt = Adam(model.parameters(), lr=1e-2)
    model[0].weight.requires_grad_(False)
    before = model[0].weight.clone()
    train(model, opt, 2)
    assert torch.equal(model[0].weight, before) and model[0].weight not in opt.state


@pytest.mark.parametrize("cls,kw", [(Adam, dict(lr=1e-2, amsgrad=True)), (AdamW, {}),
                                    (SGD, dict(lr=0.1, momentum=0.9, nesterov=True))])
def test_checkpoint_resume_is_bitwise_equal(cls, kw, tmp_path):
    model, opt = make_model(), None
    opt = cls(model.parameters(), **kw)
    train(model, opt, 5)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt.pt")
    train(model, opt, 5, seed=2)
    resumed = make_model()
    resumed_opt = cls(resumed.parameters(), **kw)
    ckpt = torch.load(tmp_path / "ckpt.pt")
    resumed.load_state_dict(ckpt["model"])
    resumed_opt.load_state_dict(ckpt["opt"])
    train(resumed, resumed_opt, 5, seed=2)
    for a, b in zip(snapshot(resumed, resumed_opt), snapshot(model, opt)):
        assert_bitwise_equal(a, b)


@pytest.mark.parametrize("cls,torch_cls,kw", [(Adam, torch.optim.Adam, dict(lr=1e-2)),
                                              (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9))])
def test_torch_state_dict_loads_into_ours(cls, torch_cls, kw):
    model32 = make_model(torch.float32)
    torch_opt = torch_cls(model32.parameters(), **kw)
    train(model32, torch_opt, 4)
    model = copy.deepcopy(model32).bfloat16()
    opt = cls(model.parameters(), **kw)
    opt.load_state_dict(torch_opt.state_dict())
    for p, p32 in zip(model.parameters(), model32.parameters()):
        state, ref = opt.state[p], torch_opt.state[p32]
        for key, value in ref.items():
            if isinstance(value, torch.Tensor) and key != "step":
                assert state[key].dtype == torch.float32
                assert torch.equal(state[key], value)
        assert state["step"].item() == (4.0 if "step" in ref else 1.0)
    train(model, opt, 2)  # masters are created from the current params
    for p in model.parameters():
        assert torch.equal(p, opt.state[p]["master_param"].bfloat16())


def test_our_state_dict_loads_into_torch_through_export_fp32():
    model = make_model()
    opt = Adam(model.parameters(), lr=1e-2)
    train(model, opt, 4)
    model32 = export_fp32(model, opt)
    for p, p32 in zip(model.parameters(), model32.parameters()):
        assert torch.equal(p32, opt.state[p]["master_param"])
    torch_opt = torch.optim.Adam(model32.parameters(), lr=1e-2)
    torch_opt.load_state_dict(opt.state_dict())
    continued = copy.deepcopy(model32)
    ref_opt = torch.optim.Adam(continued.parameters(), lr=1e-2)
    ref_opt.load_state_dict(opt.state_dict())
    train(model32, torch_opt, 2, seed=5)  # it trains on
    for p in model32.parameters():
        assert torch_opt.state[p]["step"].item() == 6.0


@pytest.mark.parametrize("tensor_lr", [False, True])
def test_lr_scheduler_float_and_tensor_lr(tensor_lr):
    lr = torch.tensor(0.1) if tensor_lr else 0.1
    model, ref = make_model(torch.float32), make_model(torch.float32)
    opt = SGD(model.parameters(), lr=lr, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, foreach=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "lr_scheduler.step() before optimizer.step()"
        train(model, opt, 6, scheduler=torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.5))
    train(ref, ref_opt, 6, scheduler=torch.optim.lr_scheduler.StepLR(ref_opt, 2, gamma=0.5))
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(0.0125)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_add_param_group_and_zero_grad():
    model = make_model()
    opt = Adam(model[0].parameters(), lr=1e-2)
    opt.add_param_group({"params": model[2].parameters(), "lr": 1e-3})
    assert opt.param_groups[1]["master_weights"] is True and opt.param_groups[1]["lr"] == 1e-3
    train(model, opt, 1)
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_master_weights_beat_plain_bf16_in_training():
    """The reason for master weights: bf16 params under plain Adam lose their small updates
    to rounding; with fp32 masters the bf16 model trains like the fp32 one."""
    def run(kind, steps=400, lr=2e-4):
        torch.manual_seed(0)
        teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
        x = torch.randn(512, 32)
        y = teacher(x).detach()
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
        if kind == "fp32":
            opt = torch.optim.Adam(model.parameters(), lr=lr)
        else:
            model = model.bfloat16()
            opt = (Adam if kind == "fused_amp" else torch.optim.Adam)(model.parameters(), lr=lr)
        dtype = next(model.parameters()).dtype
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y).backward()
            opt.step()
        with torch.no_grad():
            return torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y).item()

    fp32, ours, plain = run("fp32"), run("fused_amp"), run("plain_bf16")
    assert abs(ours - fp32) <= 0.02 * fp32, (ours, fp32)
    assert plain > 2 * fp32, (plain, fp32)


# ---- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("cls,torch_cls,kw", [
    (Adam, torch.optim.Adam, dict(lr=-1.0)), (Adam, torch.optim.Adam, dict(eps=-1.0)),
    (Adam, torch.optim.Adam, dict(betas=(1.0, 0.9))), (Adam, torch.optim.Adam, dict(betas=(0.9, -0.1))),
    (AdamW, torch.optim.AdamW, dict(weight_decay=-1.0)), (SGD, torch.optim.SGD, dict(momentum=-0.5)),
    (SGD, torch.optim.SGD, dict(lr=0.1, nesterov=True)),
    (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)),
])
def test_invalid_hyperparameters_as_torch(cls, torch_cls, kw):
    params = [torch.nn.Parameter(torch.randn(3))]
    with pytest.raises(ValueError) as theirs:
        torch_cls(params, **kw)
    with pytest.raises(ValueError, match=str(theirs.value).replace("(", r"\(").replace(")", r"\)")):
        cls(params, **kw)


def test_complex_params_refused():
    with pytest.raises(ValueError, match="complex"):
        Adam([torch.nn.Parameter(torch.randn(3, dtype=torch.complex64))])


def param_with_grad(grad, dtype=torch.bfloat16):
    p = torch.nn.Parameter(torch.randn(4, 4).to(dtype))
    p.grad = grad
    return p


@pytest.mark.parametrize("cls", [Adam, SGD])
def test_sparse_grad_refused_before_any_update(cls):
    good = param_with_grad(torch.randn(4, 4).bfloat16())
    bad = param_with_grad(torch.randn(4, 4).bfloat16().to_sparse())
    opt = cls([good, bad], lr=0.1, momentum=0.9) if cls is SGD else cls([good, bad], lr=0.1)
    before = good.clone()
    with pytest.raises(ValueError, match=r"grads\[1\] is sparse"):
        opt.step()
    assert torch.equal(good, before)


def adam_lists(n=3, dtype=torch.bfloat16):
    params = [torch.randn(4, 4).to(dtype) for _ in range(n)]
    return dict(params=params, grads=[torch.randn(4, 4).to(dtype) for _ in range(n)],
                master_params=[p.float() for p in params],
                exp_avgs=[torch.zeros(4, 4) for _ in range(n)],
                exp_avg_sqs=[torch.zeros(4, 4) for _ in range(n)], max_exp_avg_sqs=[],
                steps=[torch.zeros(()) for _ in range(n)])


@pytest.mark.parametrize("key,index,bad,exc,match", [
    ("grads", 2, torch.randn(4, 5).bfloat16(), ValueError, r"grads\[2\] has shape \[4, 5\] but params\[2\]"),
    ("grads", 2, torch.randn(4, 4), TypeError, r"grads\[2\] has dtype Float, expected BFloat16"),
    ("grads", 2, torch.randn(4, 4, device="meta").bfloat16(), ValueError, r"grads\[2\] is on meta"),
    ("master_params", 1, torch.zeros(4, 4).half(), TypeError, r"master_params\[1\] has dtype Half"),
    ("exp_avgs", 2, torch.zeros(16), ValueError, r"exp_avgs\[2\] has shape \[16\]"),
    ("exp_avg_sqs", 1, torch.zeros(1).expand(4, 4), ValueError, r"exp_avg_sqs\[1\] has elements that share"),
    ("steps", 0, torch.zeros(2), ValueError, r"steps\[0\] must have exactly one element"),
    ("params", 2, torch.randn(4, 4).to(torch.int32), TypeError, r"params\[2\] has dtype Int"),
    ("params", 1, torch.randn(4, 1).bfloat16().expand(4, 4), ValueError, r"params\[1\] has elements that share"),
])
def test_adam_op_refuses_bad_lists_before_any_update(key, index, bad, exc, match):
    lists = adam_lists()
    lists[key][index] = bad
    before = [t.clone() for t in lists["params"] + lists["exp_avgs"] + lists["steps"]
              if t.device.type == "cpu"]
    with pytest.raises(exc, match=match):
        adam_step_(**lists, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8,
                                 weight_decay=0.0, amsgrad=False, maximize=False,
                                 decoupled_weight_decay=False)
    after = [t for t in lists["params"] + lists["exp_avgs"] + lists["steps"] if t.device.type == "cpu"]
    for a, b in zip(after, before):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name,optimizer", [("adam_step_", "adam"), ("sgd_step_", "sgd"), ("lion_step_", "lion"),
                                            ("muon_momentum_", "muon_momentum")])
def test_a_removed_per_optimizer_op_names_its_replacement(name, optimizer):
    """CHANGELOG.md: the per-optimizer ops gave way to step_; calling one says what to call."""
    from fused_amp import ops
    with pytest.raises(AttributeError, match=rf"fused_amp.ops.{name} was removed: use fused_amp.ops.step_\('{optimizer}'"):
        getattr(ops, name)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_op'"):
        ops.no_such_op


def test_adam_op_refuses_mismatched_list_lengths():
    """The message names the list the user passed (the descriptor's list names), not states[0]."""
    lists = adam_lists()
    lists["exp_avgs"].pop()
    with pytest.raises(ValueError, match=r"step_\(adam\): exp_avgs has 2 tensors but params has 3"):
        adam_step_(**lists, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8,
                                 weight_decay=0.0, amsgrad=False, maximize=False,
                                 decoupled_weight_decay=False)


def test_transposed_params_are_updated_in_their_layout():
    p = torch.nn.Parameter(torch.randn(8, 6).t().contiguous().t())  # dense, column-major
    ref = torch.nn.Parameter(p.detach().clone().contiguous())
    p.grad = torch.randn(6, 8).t()
    ref.grad = p.grad.contiguous()
    Adam([p], lr=0.1).step()
    torch.optim.Adam([ref], lr=0.1, fused=True).step()
    assert_bitwise_equal(p.detach().contiguous(), ref.detach())


# ---- CUDA ---------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_cuda_parity_with_torch_fused(cls, torch_cls, kw, dtype):
    ours, fused, foreach = run_parity(cls, torch_cls, kw, dtype, "cuda")
    torch_spread = (foreach - fused).abs().max().item()
    assert (ours - fused).abs().max().item() <= max(torch_spread, one_ulp(fused))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["adam", "sgd"])
def test_results_do_not_depend_on_param_alignment(dtype, op):
    """Half params with masters are written with streaming stores from their first aligned
    vector on and element by element before it; every offset must give the same bits."""
    n = 1000
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(n, generator=gen).to(dtype)
    grad = torch.randn(n, generator=gen).to(dtype)
    results = []
    for offset in range(0, 40, 3):
        base = torch.zeros(n + 64, dtype=dtype)
        param = base[offset:offset + n]
        param.copy_(values)
        master, a, b, step = values.float(), torch.zeros(n), torch.zeros(n), torch.zeros(())
        for _ in range(3):
            if op == "adam":
                adam_step_([param], [grad], [master], [a], [b], [], [step], lr=1e-2,
                                         beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1,
                                         amsgrad=False, maximize=False, decoupled_weight_decay=True)
            else:
                sgd_step_([param], [grad], [master], [a], [step], lr=0.1, momentum=0.9,
                                        dampening=0.0, weight_decay=0.0, nesterov=True, maximize=False)
        results.append((param.clone(), master.clone()))
    for param, master in results[1:]:
        assert_bitwise_equal(param, results[0][0])
        assert_bitwise_equal(master, results[0][1])
    assert torch.equal(results[0][0], results[0][1].to(dtype))


def test_results_do_not_depend_on_thread_count():
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            gen = torch.Generator().manual_seed(0)
            params = [torch.nn.Parameter(torch.randn(n, generator=gen).bfloat16()) for n in (70_001, 33, 40_000)]
            opt = AdamW(params, lr=1e-2)
            for _ in range(3):
                for p in params:
                    p.grad = torch.randn(p.shape, generator=gen).bfloat16()
                opt.step()
            results.append([opt.state[p]["master_param"].clone() for p in params])
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(other, results[0]):
            assert_bitwise_equal(a, b)


def test_changing_group_options_between_steps():
    """The per-group lists kept between steps follow amsgrad and master_weights changes."""
    model = make_model()
    opt = Adam(model.parameters(), lr=1e-2, master_weights=False)
    train(model, opt, 2)
    opt.param_groups[0]["amsgrad"] = True
    opt.param_groups[0]["master_weights"] = True
    train(model, opt, 2)
    for p in model.parameters():
        assert "max_exp_avg_sq" in opt.state[p] and "master_param" in opt.state[p]
        assert torch.equal(p, opt.state[p]["master_param"].to(p.dtype))


def test_rprops_prev_is_the_unscaled_grad_as_torchs():
    """Rprop reads only the grad's sign, so only its `prev` state shows the scale the grad was
    unscaled by: after steps under a GradScaler it is torch's, as are the params."""
    init = torch.randn(37, generator=torch.Generator().manual_seed(0))

    def run(ours):
        p = torch.nn.Parameter(init.clone())
        opt = (fused_amp.optim.Rprop if ours else torch.optim.Rprop)([p], lr=0.01)
        scaler = (fused_amp.GradScaler if ours else torch.amp.GradScaler)("cpu", init_scale=1024.0)
        gen = torch.Generator().manual_seed(1)
        for _ in range(3):
            scaler.scale((p * torch.randn(37, generator=gen)).sum()).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        return p.detach(), opt.state[p]["prev"]

    (p_ours, prev_ours), (p_torch, prev_torch) = run(True), run(False)
    torch.testing.assert_close(prev_ours, prev_torch, rtol=1e-6, atol=0)
    torch.testing.assert_close(p_ours, p_torch, rtol=1e-6, atol=0)
