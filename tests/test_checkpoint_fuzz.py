"""Malformed checkpoints (issue 24, item 5): random corruptions of real state dicts of every
optimizer (registry), in every memory mode, and of the GradScaler. What cannot step correctly
is refused by load_state_dict itself, naming the entry, before anything is replaced: the
optimizer then holds its previous state and steps exactly as before. What torch loads and
steps correctly (extra keys, moments in float64, Python-number steps, options that later
versions added missing) loads and steps exactly as the uncorrupted checkpoint."""
import copy
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fused_amp
from helpers import assert_bitwise_equal
from optim_registry import STATEFUL, STATEFUL_IDS

MODES = [dict(), dict(master_weights="remainder", state_dtype=torch.bfloat16),
         dict(master_weights="remainder8", state_dtype=torch.uint8, min_8bit_size=64)]
SHAPES = [(8, 16), (300,), (5,)]
REFUSED = (ValueError, TypeError, KeyError, RuntimeError)
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def set_grads(params, seed):
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)


def trained(cls, kw, mode):
    """An optimizer over bf16 params in two groups and an fp32 param in a third, stepped 3 times."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).bfloat16()) for s in SHAPES]
    params.append(torch.nn.Parameter(torch.randn(4, generator=gen)))
    opt = cls([{"params": params[:2]}, {"params": params[2:3], "lr": kw["lr"] / 2},
               {"params": params[3:], "master_weights": True}], **kw, **mode)
    for step in range(3):
        set_grads(params, step)
        opt.step()
    return params, opt


def stepped(params, opt, seed=10):
    set_grads(params, seed)
    opt.step()
    return [p.detach().clone() for p in params]


def assert_same_state(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i, entry in a["state"].items():
        assert entry.keys() == b["state"][i].keys()
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                assert_bitwise_equal(value, b["state"][i][key], f"state[{i}][{key!r}]")
            else:
                assert value == b["state"][i][key]


# ---- corruptions: each changes a state dict and says whether it must be refused, and which
# ---- name the error must give

def _stepped_ids(sd):
    return sorted(i for i, e in sd["state"].items() if any(isinstance(v, torch.Tensor) and v.dim() > 0
                                                          for k, v in e.items() if k != "master_param"))


def _moment_keys(entry):
    return sorted(k for k, v in entry.items() if isinstance(v, torch.Tensor) and v.dim() > 0
                  and k != "master_param")


@st.composite
def corruptions(draw, sd):
    """(corrupted state dict, refused?, a name the error must hold)."""
    sd = copy.deepcopy(sd)
    ids = _stepped_ids(sd)
    i = draw(st.sampled_from(ids))
    entry = sd["state"][i]
    key = draw(st.sampled_from(_moment_keys(entry)))
    value = entry[key]
    group = draw(st.sampled_from(range(len(sd["param_groups"]))))
    g = sd["param_groups"][group]
    kind = draw(st.sampled_from([
        "moment-shape", "moment-dtype", "moment-nonfinite", "moment-not-tensor", "moment-missing",
        "square-negative", "step-bad", "step-missing", "state-not-dict", "master-bad",
        "group-option", "group-option-missing", "group-params", "groups-count", "top-level",
        "extra-state-key", "extra-group-key", "moment-float64", "step-number", "default-missing"]))
    if kind == "moment-shape":
        entry[key] = value.flatten()[:-1] if draw(st.booleans()) else value.reshape(1, *value.shape)
        return sd, True, key
    if kind == "moment-dtype":
        dtype = draw(st.sampled_from([torch.int64, torch.bool, torch.complex64]))
        entry[key] = value.to(dtype)
        return sd, True, key
    if kind == "moment-nonfinite":
        flat = value.flatten().clone()
        flat[draw(st.integers(0, flat.numel() - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        entry[key] = flat.reshape(value.shape)
        return sd, True, key
    if kind == "moment-not-tensor":
        entry[key] = draw(st.sampled_from(["zeros", [0.0] * 3, {"a": 1}, 1.5]))
        return sd, True, key
    if kind == "moment-missing":
        del entry[key]
        return sd, True, key
    if kind == "square-negative":
        squares = [k for k in _moment_keys(entry) if k in ("exp_avg_sq", "max_exp_avg_sq")]
        if not squares:
            return corrupt_step(draw, sd, entry)
        key = draw(st.sampled_from(squares))
        entry[key] = entry[key].clone()
        entry[key].view(-1)[0] = -1.0
        return sd, True, key
    if kind == "step-bad":
        return corrupt_step(draw, sd, entry)
    if kind == "step-missing":
        if "step" not in entry or key == "momentum_buffer":  # SGD: torch's state has no step
            return corrupt_step(draw, sd, entry)
        del entry["step"]
        return sd, True, "step"
    if kind == "state-not-dict":
        sd["state"][i] = draw(st.sampled_from([None, [1, 2], "state", torch.zeros(3)]))
        return sd, True, f"state[{i}]"
    if kind == "master-bad":
        if "master_param" not in entry:
            entry["master_param"] = torch.zeros(3)  # for a param without one (wrong shape)
        else:
            entry["master_param"] = draw(st.sampled_from([entry["master_param"].flatten()[1:],
                                                          entry["master_param"].int(), "w"]))
        return sd, True, "master_param"
    if kind == "group-option":
        options = [k for k in ("lr", "eps", "weight_decay", "momentum", "betas") if k in g]
        option = draw(st.sampled_from(options))
        if option == "betas":
            g[option] = draw(st.sampled_from([(1.5, 0.9), (0.9, -0.1), (0.9,), (math.nan, 0.9), "b"]))
        else:
            g[option] = draw(st.sampled_from([-1.0, math.nan, "1e-3", None]))
        return sd, True, f"param_groups[{group}]"
    if kind == "group-option-missing":
        option = draw(st.sampled_from([k for k in ("lr", "weight_decay") if k in g]))
        del g[option]
        return sd, True, option
    if kind == "group-params":
        g["params"] = g["params"][:-1] if draw(st.booleans()) else g["params"] + [99]
        return sd, True, "parameter group"
    if kind == "groups-count":
        if draw(st.booleans()):
            sd["param_groups"] = sd["param_groups"][:-1]
        else:
            sd["param_groups"] = sd["param_groups"] + [copy.deepcopy(g)]
        return sd, True, "number of parameter groups"
    if kind == "top-level":
        which = draw(st.sampled_from(["state", "param_groups"]))
        if draw(st.booleans()):
            del sd[which]
        else:
            sd[which] = "broken"
        return sd, True, which
    # accepted: torch loads these and steps correctly
    if kind == "extra-state-key":
        entry["note"] = draw(st.sampled_from(["saved by hand", torch.ones(2), 3]))
        return sd, False, None
    if kind == "extra-group-key":
        g["note"] = "saved by hand"
        return sd, False, None
    if kind == "moment-float64":
        entry[key] = value.double()
        return sd, False, None
    if kind == "step-number":
        if "step" in entry:
            entry["step"] = draw(st.sampled_from([int(entry["step"].item()), float(entry["step"].item())]))
        return sd, False, None
    assert kind == "default-missing"  # an option torch added later, at its default
    for option, default in (("maximize", False), ("foreach", None), ("differentiable", False)):
        if g.get(option, default) == default:
            g.pop(option, None)
    return sd, False, None


def corrupt_step(draw, sd, entry):
    entry["step"] = draw(st.sampled_from([torch.tensor(math.nan), torch.tensor(-1.0), torch.tensor(2.5),
                                          torch.tensor(math.inf), torch.ones(2), "3", -2, True]))
    return sd, True, "step"


@pytest.mark.parametrize("mode", MODES, ids=["fp32", "remainder+bf16", "24-bit+8-bit"])
@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
@FUZZ
@given(data=st.data())
def test_a_corrupted_checkpoint_is_refused_or_steps_as_the_original(cls, torch_cls, kw, mode, data):
    params, opt = trained(cls, kw, mode)
    original = opt.state_dict()
    corrupted, refused, name = data.draw(corruptions(original))
    reference_params, reference = copy.deepcopy((params, opt))
    if refused:
        before = copy.deepcopy(opt.state_dict())
        with pytest.raises(REFUSED) as info:
            opt.load_state_dict(corrupted)
        assert name in str(info.value), (name, str(info.value))
        assert_same_state(opt.state_dict(), before)
    else:
        opt.load_state_dict(corrupted)
        reference.load_state_dict(copy.deepcopy(original))
    for a, b in zip(stepped(params, opt), stepped(reference_params, reference)):
        assert_bitwise_equal(a, b)


# ---- the GradScaler ------------------------------------------------------------------------

def trained_scaler():
    scaler = fused_amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=3)
    p = torch.nn.Parameter(torch.ones(4))
    opt = fused_amp.optim.SGD([p], lr=0.1)
    for step in range(5):
        p.grad = torch.full((4,), math.inf if step == 2 else 1.0)
        scaler.scale(torch.ones(()))
        scaler.step(opt)
        scaler.update()
    return scaler


@st.composite
def scaler_corruptions(draw, sd):
    sd = dict(sd)
    key = draw(st.sampled_from(["scale", "growth_factor", "backoff_factor", "growth_interval",
                                "_growth_tracker", "extra", "missing"]))
    if key == "missing":
        key = draw(st.sampled_from(["scale", "growth_factor", "backoff_factor", "growth_interval",
                                    "_growth_tracker"]))
        del sd[key]
        return sd, True, key
    if key == "extra":
        sd["note"] = "saved by hand"
        return sd, False, None
    bad = {"scale": [math.nan, math.inf, 0.0, -4.0, "256", 1e39],
           "growth_factor": [1.0, 0.5, math.nan, math.inf, "2"],
           "backoff_factor": [1.0, 0.0, -0.5, math.nan, 2.0],
           "growth_interval": [2.5, "3", None, 2 ** 40],
           "_growth_tracker": [-1, 1.5, "0", 2 ** 40]}[key]
    sd[key] = draw(st.sampled_from(bad))
    return sd, True, key


@FUZZ
@given(data=st.data())
def test_a_corrupted_scaler_checkpoint_is_refused_before_anything_changes(data):
    scaler = trained_scaler()
    original = scaler.state_dict()
    corrupted, refused, name = data.draw(scaler_corruptions(original))
    if refused:
        with pytest.raises(REFUSED) as info:
            scaler.load_state_dict(corrupted)
        assert name in str(info.value), (name, str(info.value))
    else:
        scaler.load_state_dict(corrupted)
    assert scaler.state_dict() == original
    scaler.update(scaler.get_scale() * 2)  # and it goes on scaling
    assert scaler.get_scale() == original["scale"] * 2


def test_what_torch_checkpoints_hold_loads():
    """torch's own checkpoints pass the checks: each optimizer's torch counterpart (where torch
    has one), trained, loads into ours."""
    for cls, torch_cls, kw in STATEFUL:
        if not torch_cls.__module__.startswith("torch"):
            continue
        params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
        theirs = torch_cls(params, **kw)
        for step in range(2):
            set_grads(params, step)
            theirs.step()
        ours = cls([torch.nn.Parameter(p.detach().bfloat16()) for p in params], **kw)
        ours.load_state_dict(theirs.state_dict())
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))
    fused_amp.GradScaler("cpu").load_state_dict(scaler.state_dict())
