"""The steady-state step (fused_amp/optim/_replay.py): a one-group step made again with new
grads and lr. Every step of a run with replays is bit for bit the same step without them, for
every optimizer and storage kind, whatever changes between steps; and the steady state does
replay (the general step's list gathering does not run)."""
import copy

import pytest
import torch

import fused_amp
from fused_amp.optim import _group_lists, _replay
from helpers import assert_bitwise_equal
from optim_registry import STATEFUL, STATEFUL_IDS, STORAGE

SHAPES = [(5, 7), (33,)]


def set_grads(params, seed):
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)


def snapshot(opt, params):
    out = [p.detach().clone() for p in params] + [p.grad.clone() for p in params if p.grad is not None]
    for p in params:
        out += [opt.state[p][k].clone() for k in sorted(opt.state.get(p, {}))
                if isinstance(opt.state[p][k], torch.Tensor)]
    return out


def _tensor_lr(opt, params, seed):
    opt.param_groups[0]["lr"] = torch.tensor(opt.param_groups[0]["lr"] * 0.5)


def _scaler_step(opt, params, seed):
    scaler = fused_amp.GradScaler("cpu", init_scale=256.0)
    scaler.scale(sum((p.float() ** 2).sum() for p in params)).backward()
    scaler.step(opt)
    return True  # (stepped)


def _clip(opt, params, seed):
    opt.clip_grad_norm_(0.1)


def _replace_state(opt, params, seed):
    state = opt.state[params[0]]
    key = sorted(k for k, v in state.items() if isinstance(v, torch.Tensor) and v.shape == params[0].shape)[0]
    state[key] = state[key].clone()


def _reload(opt, params, seed):
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))


def _no_grad(opt, params, seed):
    params[1].grad = None


def _new_group(opt, params, seed):
    extra = torch.nn.Parameter(torch.ones(4, dtype=params[0].dtype))
    extra.grad = torch.full((4,), 0.5, dtype=params[0].dtype)
    opt.add_param_group({"params": [extra]})


def _move_a_hyperparameter(opt, params, seed):
    """As a scheduler would at every step: a value that keeps the same states (Rprop has no
    weight decay: its step sizes' growth)."""
    group = opt.param_groups[0]
    if "weight_decay" in group:
        group["weight_decay"] += 0.01 * (seed + 1)
    else:
        group["etas"] = (0.4, 1.1 + 0.01 * seed)


def _change_the_states(opt, params, seed):
    """A hyperparameter that decides which states the step keeps (where the optimizer has one)."""
    group = opt.param_groups[0]
    for key, value in (("amsgrad", not group.get("amsgrad")), ("centered", not group.get("centered")),
                       ("momentum", 0.0 if group.get("momentum") else 0.9)):
        if key in group:
            group[key] = value
            return


# what changes between steps, each followed by steps that may replay again
EVENTS = {
    "hyperparameter moved": _move_a_hyperparameter,
    "states' hyperparameter": _change_the_states,
    "float lr": lambda opt, params, seed: opt.param_groups[0].__setitem__(
        "lr", opt.param_groups[0]["lr"] * 0.5),
    "tensor lr": _tensor_lr,
    "maximize": lambda opt, params, seed: opt.param_groups[0].__setitem__(
        "maximize", not opt.param_groups[0]["maximize"]),
    "unscale_grads": lambda opt, params, seed: opt.param_groups[0].__setitem__("unscale_grads", False),
    "max_grad_norm": lambda opt, params, seed: opt.param_groups[0].__setitem__("max_grad_norm", 0.1),
    "clip_grad_norm_": _clip,
    "scaler step": _scaler_step,
    "state replaced": _replace_state,
    "state_dict reloaded": _reload,
    "a grad is None": _no_grad,
    "param appended": lambda opt, params, seed: opt.param_groups[0]["params"].append(params[2]),
    "new group": _new_group,
}


def run(cls, kw, dtype, options, replays, event, monkeypatch):
    """Snapshots of every step: 2 steps, the event, 3 steps."""
    if not replays:
        monkeypatch.setattr(_replay.Replay, "of", classmethod(lambda cls_, *args: None))
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in SHAPES + [(6,)]]
    opt = cls(params[:2], **kw, **options)
    out = []
    for seed in range(6):
        set_grads(params, seed)
        stepped = EVENTS[event](opt, params, seed) if seed == 2 else None
        if not stepped:
            opt.step()
        out.append(snapshot(opt, params))
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("event", list(EVENTS))
@pytest.mark.parametrize("storage", ["fp32", "bf16 + fp32 master", "bf16 + 24-bit, stochastic",
                                     "bf16 + fp32 master, 8-bit state"])
@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_steps_with_replays_are_the_steps_without(cls, torch_cls, kw, storage, event, monkeypatch):
    dtype, options = STORAGE[storage]
    with_replays = run(cls, kw, dtype, options, True, event, monkeypatch)
    without = run(cls, kw, dtype, options, False, event, monkeypatch)
    for step, (a, b) in enumerate(zip(with_replays, without)):
        assert len(a) == len(b), f"step {step}"
        for x, y in zip(a, b):
            assert_bitwise_equal(x, y)


@pytest.mark.parametrize("cls,torch_cls,kw", STATEFUL, ids=STATEFUL_IDS)
def test_the_steady_state_replays_and_a_change_steps_in_full(cls, torch_cls, kw, monkeypatch):
    """After a first step, the next ones do not gather the lists (ListCache.lists), nor when the
    lr or another hyperparameter moves; a changed option or a scaler's step does, once, and the
    steps after it replay again."""
    gathered = []
    lists = _group_lists.ListCache.lists
    monkeypatch.setattr(_group_lists.ListCache, "lists", lambda *a: (gathered.append(1), lists(*a))[1])
    params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    opt = cls(params, **kw)

    def steps(n):
        before = len(gathered)
        for seed in range(n):
            set_grads(params, seed)
            opt.step()
        return len(gathered) - before

    assert steps(4) == 1
    opt.param_groups[0]["lr"] *= 0.5  # (the lr alone changes nothing the replay keeps)
    assert steps(3) == 0
    for seed in range(3):  # (nor a scheduler's move of another hyperparameter, at every step)
        _move_a_hyperparameter(opt, params, seed)
        assert steps(1) == 0
    opt.param_groups[0]["unscale_grads"] = False  # (an option the call was built with)
    assert steps(3) == 1
    _scaler_step(opt, params, 0)
    assert steps(3) == 1


def test_a_bad_grad_in_the_steady_state_is_refused_before_anything_changes():
    params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    opt = fused_amp.optim.AdamW(params)
    for seed in range(3):
        set_grads(params, seed)
        opt.step()
    before, dense = snapshot(opt, params), params[1].grad
    params[1].grad = dense.to_sparse()
    with pytest.raises(ValueError, match="sparse"):
        opt.step()
    params[1].grad = dense
    for x, y in zip(snapshot(opt, params), before, strict=True):
        assert_bitwise_equal(x, y)
