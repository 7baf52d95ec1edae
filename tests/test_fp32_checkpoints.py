"""Checkpoints between fp32 models and half models with masters (export_fp32, import_fp32), and
the clip options kept in the param groups and so in checkpoints, as torch keeps every option."""
import copy
import math

import pytest
import torch

from fused_amp.optim import export_fp32, import_fp32
from helpers import assert_bitwise_equal
from optim_registry import PLAIN, PLAIN_IDS

MODES = [(True, torch.bfloat16), (True, torch.float16), ("remainder", torch.bfloat16),
         ("remainder8", torch.bfloat16), (False, torch.bfloat16)]
MODE_IDS = [f"{m}-{str(d).split('.')[1]}" for m, d in MODES]


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))


def fixed_grads(model, step, dtype=torch.bfloat16):
    """Grads exactly representable in ``dtype``, so that fp32 and half runs see the same ones."""
    gen = torch.Generator().manual_seed(100 + step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen).to(dtype).to(p.dtype)


def trained_fp32(torch_cls, kw, steps=3):
    model32 = make_model()
    opt32 = torch_cls(model32.parameters(), **kw)
    for step in range(steps):
        fixed_grads(model32, step)
        opt32.step()
    return model32, opt32


def round_to_24_bits(x):
    """fp32 rounded to its top 24 bits (15 stored mantissa bits), to nearest even, by integer
    arithmetic (finite values)."""
    bits = x.view(torch.int32).long()
    bits = (bits + 0x7F + ((bits >> 8) & 1)) & ~0xFF
    return bits.to(torch.int32).view(torch.float32)


@pytest.mark.parametrize("mode,dtype", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_import_fp32_makes_the_fp32_weights_the_masters(cls, torch_cls, kw, mode, dtype):
    """The fp32 weights become the masters bitwise (24-bit masters: rounded to nearest even),
    the params what a step writes from them, the moments torch's; export_fp32 gives the fp32
    weights back bitwise. model.load_state_dict alone would start the masters from the rounded
    weights (checked: they differ)."""
    model32, opt32 = trained_fp32(torch_cls, kw)
    weights = model32.state_dict()
    model = make_model().to(dtype)
    for p in model.parameters():
        p.detach().zero_()  # whatever the half model held must not matter
    opt = cls(model.parameters(), **kw, master_weights=mode)
    import_fp32(model, opt, weights, opt32.state_dict())
    saved = opt.state_dict()["state"]
    for i, ((name, p), p32) in enumerate(zip(model.named_parameters(), model32.parameters())):
        w = weights[name]
        if mode in (True, "remainder"):
            assert_bitwise_equal(saved[i]["master_param"], w, name)
        elif mode == "remainder8":
            assert_bitwise_equal(saved[i]["master_param"], round_to_24_bits(w), name)
        else:
            assert "master_param" not in saved.get(i, {})
        if mode is True or mode is False:
            assert_bitwise_equal(p.detach(), w.to(dtype), name)  # round to nearest even
        else:  # the high half of the master, to nearest (ties away from zero)
            master = saved[i]["master_param"]
            half_ulp = (master.to(dtype).float() - master).abs().max()
            assert (p.detach().float() - master).abs().max() <= half_ulp, name
        for key, value in opt32.state[p32].items():
            if key != "step":
                assert_bitwise_equal(saved[i][key], value, f"{name} {key}")
    if mode in (True, "remainder"):
        for a, b in zip(export_fp32(model, opt).parameters(), model32.parameters()):
            assert_bitwise_equal(a.detach(), b.detach())
    if mode is True:  # what the old way (load the weights, the masters follow) loses
        plain = make_model().to(dtype)
        plain.load_state_dict(weights)
        plain_opt = cls(plain.parameters(), **kw)
        plain_opt.load_state_dict(opt32.state_dict())
        fixed_grads(plain, 0)
        plain_opt.step()
        assert not torch.equal(plain_opt.state[next(plain.parameters())]["master_param"],
                               opt.state_dict()["state"][0]["master_param"])


@pytest.mark.parametrize("mode", [True, "remainder"])
@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_a_run_resumed_by_import_fp32_continues_the_fp32_run_bitwise(cls, torch_cls, kw, mode):
    """From an fp32 checkpoint, a bf16 model with exact masters trains on exactly as the fp32
    model under our optimizer does (the same grads: the masters are the fp32 weights)."""
    model32, opt32 = trained_fp32(torch_cls, kw)
    fp32_run = copy.deepcopy(model32)
    fp32_opt = cls(fp32_run.parameters(), **kw)
    fp32_opt.load_state_dict(opt32.state_dict())
    half_run = make_model().bfloat16()
    half_opt = cls(half_run.parameters(), **kw, master_weights=mode)
    import_fp32(half_run, half_opt, model32.state_dict(), opt32.state_dict())
    for step in range(3, 8):
        fixed_grads(fp32_run, step)
        fixed_grads(half_run, step)
        fp32_opt.step()
        half_opt.step()
    for a, b in zip(export_fp32(half_run, half_opt).parameters(), fp32_run.parameters()):
        assert_bitwise_equal(a.detach(), b.detach())


def test_import_fp32_refuses_a_missing_or_misshapen_weight_before_loading_anything():
    cls, torch_cls, kw = PLAIN[0]
    model32, opt32 = trained_fp32(torch_cls, kw)
    model = make_model().bfloat16()
    opt = cls(model.parameters(), **kw)
    fixed_grads(model, 0)
    opt.step()
    before = [t.clone() for t in model.parameters()] + [opt.state[p]["master_param"].clone()
                                                          for p in model.parameters()]
    missing = {k: v for k, v in model32.state_dict().items() if k != "2.weight"}
    with pytest.raises(KeyError, match="'2.weight'"):
        import_fp32(model, opt, missing, opt32.state_dict())
    misshapen = dict(model32.state_dict(), **{"0.bias": torch.zeros(31)})
    with pytest.raises(ValueError, match=r"'0.bias'.*\(31,\).*\(32,\)"):
        import_fp32(model, opt, misshapen, opt32.state_dict())
    after = [t for t in model.parameters()] + [opt.state[p]["master_param"] for p in model.parameters()]
    for a, b in zip(after, before):
        assert_bitwise_equal(a.detach(), b)


# ---- max_grad_norm / grad_norm_type are group options ---------------------------------------

def clipped_run(opt, model, steps):
    for step in range(steps):
        fixed_grads(model, step)
        for p in model.parameters():
            p.grad.mul_(100.0)  # every step clips
        opt.step()


@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_clip_options_travel_in_the_state_dict(cls, torch_cls, kw):
    model = make_model().bfloat16()
    opt = cls(model.parameters(), **kw, max_grad_norm=0.5, grad_norm_type=math.inf)
    clipped_run(opt, model, 2)
    state_dict = opt.state_dict()
    assert all(g["max_grad_norm"] == 0.5 and g["grad_norm_type"] == math.inf
               for g in state_dict["param_groups"])
    resumed_model = copy.deepcopy(model)
    resumed = cls(resumed_model.parameters(), **kw)  # built without clipping, as resume code may be
    resumed.load_state_dict(copy.deepcopy(state_dict))
    assert (resumed.max_grad_norm, resumed.grad_norm_type) == (0.5, math.inf)
    clipped_run(opt, model, 3)
    clipped_run(resumed, resumed_model, 3)
    for a, b in zip(resumed_model.parameters(), model.parameters()):
        assert_bitwise_equal(a.detach(), b.detach())
    # a torch checkpoint has no clip options: this optimizer keeps its own
    _, opt32 = trained_fp32(torch_cls, kw)
    ours = cls(make_model().bfloat16().parameters(), **kw, max_grad_norm=2.0)
    ours.load_state_dict(opt32.state_dict())
    assert (ours.max_grad_norm, ours.grad_norm_type) == (2.0, 2.0)


@pytest.mark.parametrize("cls,torch_cls,kw", PLAIN, ids=PLAIN_IDS)
def test_clip_options_must_agree_across_groups(cls, torch_cls, kw):
    a, b = make_model().bfloat16(), make_model().bfloat16()
    with pytest.raises(ValueError, match="max_grad_norm is 2.0 in param group 1"):
        cls([{"params": a.parameters()}, {"params": b.parameters(), "max_grad_norm": 2.0}],
            **kw, max_grad_norm=1.0)
    opt = cls(a.parameters(), **kw, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="grad_norm_type is 1.0 in param group 1"):
        opt.add_param_group({"params": b.parameters(), "grad_norm_type": 1.0})
    assert len(opt.param_groups) == 1  # refused before it was added, as torch's checks
    opt.add_param_group({"params": b.parameters()})
    opt.max_grad_norm = 3.0  # the attribute sets every group
    assert [g["max_grad_norm"] for g in opt.param_groups] == [3.0, 3.0]
    with pytest.raises(ValueError, match="max_grad_norm"):
        opt.max_grad_norm = -1.0
    opt.param_groups[1]["max_grad_norm"] = 4.0  # changed by hand in one group only
    fixed_grads(a, 0)
    fixed_grads(b, 0)
    before = [p.detach().clone() for p in a.parameters()]
    with pytest.raises(ValueError, match="max_grad_norm is 4.0 in param group 1"):
        opt.step()
    for p, q in zip(a.parameters(), before):
        assert_bitwise_equal(p.detach(), q)


@pytest.mark.parametrize("bad,match", [(-1.0, "max_grad_norm"), ("1", "max_grad_norm"),
                                       (math.nan, "max_grad_norm")])
def test_a_checkpoint_with_a_bad_clip_option_is_refused_before_anything_changes(bad, match):
    cls, _, kw = PLAIN[0]
    model = make_model().bfloat16()
    opt = cls(model.parameters(), **kw, max_grad_norm=1.0)
    clipped_run(opt, model, 1)
    state_dict = opt.state_dict()
    state_dict["param_groups"][0]["max_grad_norm"] = bad
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises((ValueError, TypeError), match=match):
        opt.load_state_dict(state_dict)
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    for i, state in before["state"].items():
        for key, value in state.items():
            assert_bitwise_equal(after["state"][i][key], value)


def test_a_pickle_from_before_the_clip_options_were_group_options_keeps_them():
    cls, _, kw = PLAIN[0]
    opt = cls(make_model().bfloat16().parameters(), **kw, max_grad_norm=0.25, grad_norm_type=1.0)
    old = opt.__getstate__()
    old["param_groups"] = [{k: v for k, v in g.items() if k not in ("max_grad_norm", "grad_norm_type")}
                           for g in old["param_groups"]]
    old["defaults"] = {k: v for k, v in old["defaults"].items()
                       if k not in ("max_grad_norm", "grad_norm_type")}
    old.update(max_grad_norm=0.25, grad_norm_type=1.0)  # as attributes, where they were kept
    loaded = cls.__new__(cls)
    loaded.__setstate__(old)
    assert (loaded.max_grad_norm, loaded.grad_norm_type) == (0.25, 1.0)
    assert loaded.param_groups[0]["max_grad_norm"] == 0.25
