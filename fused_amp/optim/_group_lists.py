"""The tensor lists the fused step takes, per param group and device: built from the params and
their state (which MasterWeightOptimizer._init_state creates at a param's first step), and kept
between eager steps while nothing they were built from has changed."""
import operator
from collections import defaultdict
from itertools import repeat
from typing import Any, Dict

import torch

import fused_amp._C as _C  # the extension module itself, not the package face
from fused_amp.optim import _float8, _float8_copies, _quantize
from fused_amp.optim._grad_norm import DTensor, local_grads, local_shard, local_shards
from fused_amp.optim._memory import MASTER_KEYS as _MASTER_KEYS
# the lists of tensors the fused ops take that stay the same from step to step (with the state's)
_KEPT_LISTS = ("params", "master_params", "steps", "state_absmaxes")


def _master_entry(state):
    """What the fused op takes as a param's master: the fp32 master, the remainder (int16 or
    uint8), or None."""
    for key in _MASTER_KEYS:
        master = state.get(key)
        if master is not None:
            return master
    return None


def _absmax_entry(state):
    """The absmax rows of a param's 8-bit state, or None."""
    return state.get(_quantize.ABSMAX)


_MASTER_AND_ABSMAX_KEYS = _MASTER_KEYS + (_quantize.ABSMAX,)


def _entries(state_dicts, key) -> list:
    """``state.get(key)`` of each param's state dict, in one C-level pass."""
    return list(map(dict.get, state_dicts, repeat(key)))


class Hyper:
    """A group's hyperparameters (the optimizer's ``_hyper``: name -> value) and what follows from
    them: the state keys its step op keeps (``moments``, the C++ descriptor's answer) and the
    floats the op takes, in its order (``values``). Worked out once, and reused while the values
    compare equal (``same``): a scheduler that moves one at every step pays for it at every step."""

    __slots__ = ("items", "moments", "values", "reusable")

    def __init__(self, optimizer, items):
        self.items = items
        self.moments = optimizer._kept_keys(items)
        self.values = [float(items[name]) for name in optimizer._hyper_names]
        # a tensor compares equal to itself, whatever it was set to in place: read anew each step
        self.reusable = not any(isinstance(v, torch.Tensor) for v in items.values())

    def same(self, items) -> bool:
        return self.reusable and self.items == items


class GroupLists:
    """The per-device tensor lists of one param group, kept between eager steps.

    Gathering them costs a few microseconds per param, so they are kept while nothing they were
    built from has changed: the group's params (same objects, same order, and for DTensors the
    same local tensors), the optimizer's ``state`` mapping, each param's state dict and every
    tensor in it, and the group options that decide which state exists. Checking that is one C
    pass over the params (``fused_amp._C.lists_unchanged``).
    """

    def __init__(self, group, params, state, state_dicts, options, keys, by_device, sharded, hyper):
        self.group = group
        # the group's latest hyperparameters (ListCache.hyper), which follow the group's values;
        # what the lists hold depends only on the state keys, which ``options`` holds
        self.hyper = hyper
        self.state = state
        self.options = options
        # what lists_unchanged compares: the params; for DTensors their local tensors (a DTensor
        # param can get another and stay the same object: torch.utils.swap_tensors, as model.to()
        # does under swap_module_params_on_conversion); each param's state dict; and every state
        # entry the lists were built from, masters and absmaxes among them (None where a param
        # has none)
        keys = keys + _MASTER_AND_ABSMAX_KEYS
        self.held = (list(params), local_shards(params) if sharded else None, state_dicts, keys,
                     [_entries(state_dicts, key) for key in keys])
        self.by_device = by_device  # device -> (lists, indices into the group's params)
        # a C++ reference to each tensor the ops take from these lists, so that calling them does
        # not move the tensors' Python refcounts (csrc/py_lists.h)
        self.refs = _C.hold_refs([t for lists, _ in by_device.values()
                                  for key in _KEPT_LISTS + keys if key in lists for t in lists[key]])

    def follow(self, optimizer, items) -> Hyper:
        """The group's hyperparameters with these values (``optimizer._hyper``'s): the kept ones
        while the values are the same, else worked out anew and kept (a scheduler moves them)."""
        if not self.hyper.same(items):
            self.hyper = Hyper(optimizer, items)
        return self.hyper

    def still_valid(self, group, params, state, options) -> bool:
        return self.options == options and self.holds(group, params, state)

    def holds(self, group, params, state) -> bool:
        """Whether the group, its params and their state are what the lists were built from."""
        return self.group is group and self.state is state and _C.lists_unchanged(params, state, DTensor, self.held)


class ListCache:
    """The per-device lists of each param group's params with grads, kept between eager steps
    while nothing they were built from has changed: the optimizer's ``_lists`` (``groups``:
    group index -> GroupLists)."""

    def __init__(self):
        self.groups: Dict[int, GroupLists] = {}

    def forget(self) -> None:
        self.groups.clear()

    def drop_removed(self, live: int) -> None:
        """Lets go of the lists of groups no longer in the optimizer (the cache holds their tensors)."""
        if len(self.groups) > live:  # (each step asks: nothing to build when none was removed)
            for stale in [k for k in self.groups if k >= live]:
                del self.groups[stale]

    def hyper(self, optimizer, index, group) -> Hyper:
        """The group's hyperparameters now (``GroupLists.follow`` where its lists are kept)."""
        items = optimizer._hyper(group)
        cached = None if torch.compiler.is_compiling() else self.groups.get(index)  # (as in lists)
        return Hyper(optimizer, items) if cached is None else cached.follow(optimizer, items)

    def lists(self, optimizer, index, group, hyper) -> Dict[torch.device, Dict[str, list]]:
        """The params of ``group`` that have grads, with their state, per device; ``hyper``: the
        group's ``hyper``.

        Rebuilt whenever the params, the state or the options it depends on changed (see
        GroupLists); otherwise only the grads are gathered anew. A step that torch.compile traces
        builds them and keeps nothing: the compiled step runs none of this again."""
        params = group["params"]
        grads, grad_refs = _group_grads(optimizer, index, params)  # (local shards of DTensor grads)
        compiling = torch.compiler.is_compiling()  # (a traced step reads nothing kept: no guards on it)
        cached = None if compiling else self.groups.get(index)
        moments = hyper.moments  # (the group's _state_keys_for)
        keys = moments + ((optimizer._scalar_state[0],) if optimizer._scalar_state else ())
        options = (keys, group["master_weights"], group["state_dtype"], group["min_8bit_size"],
                   group["float8_scales"])
        keep = all(map(operator.is_not, grads, repeat(None))) and not compiling
        if keep and cached is not None and cached.still_valid(group, params, optimizer.state, options):
            for lists, indices in cached.by_device.values():
                lists["grads"] = grads if len(indices) == len(grads) else list(map(grads.__getitem__, indices))
                lists["grad_refs"] = grad_refs
            return {device: lists for device, (lists, _) in cached.by_device.items()}
        by_device: Dict[torch.device, Any] = defaultdict(lambda: (defaultdict(list), []))
        for i, p in enumerate(params):
            if grads[i] is None:
                continue
            state = optimizer._init_state(p, group, moments)
            lists, indices = by_device[p.device]
            indices.append(i)
            lists["params"].append(p)
            lists["grads"].append(grads[i])
            lists["master_params"].append(_master_entry(state))
            lists["steps"].append(state["step"])
            lists["state_absmaxes"].append(_absmax_entry(state))
            for key in keys:
                lists[key].append(state[key])
        # no masters at all (fp32 params): an empty list, which the op takes for "none"; else an
        # empty tensor where a param has none (the op's lists hold no None: torch.compile's
        # functionalization refuses them in a written list), made once with the kept lists
        for device, (lists, _) in by_device.items():
            for key in ("master_params", "state_absmaxes"):
                if not any(m is not None for m in lists[key]):
                    lists[key] = []
                elif not all(m is not None for m in lists[key]):
                    lists[key] = [torch.empty(0, device=device) if m is None else m for m in lists[key]]
        # DTensor params (FSDP2): the kernels run on the local shards of param, grad, master and
        # state, which share the param's placement; the state itself stays DTensor. The params
        # themselves stay in "sharded_params" (their mesh and placements, for what needs whole
        # matrices: Muon)
        sharded = DTensor is not None and any(isinstance(p, DTensor) for p in params)
        if sharded:
            for lists, _ in by_device.values():
                lists["sharded_params"] = lists["params"]
                for key in lists:
                    if key not in ("steps", "sharded_params", "grads"):  # (grads: local already)
                        lists[key] = [local_shard(t) for t in lists[key]]
        for lists, _ in by_device.values():
            lists["grad_refs"] = grad_refs
            if sharded:
                _float8.plan(lists, group)  # torchao's float8 weights (FSDP2's fp8 all-gather)
            _float8_copies.plan(optimizer, lists)  # fp8 copies the step writes (fused_amp.float8)
            optimizer._plan_lists(lists)
        # drop what is kept for this group (step() drops that of groups no longer in the optimizer)
        self.groups.pop(index, None)
        if keep:
            self.groups[index] = GroupLists(
                group, params, optimizer.state, [optimizer.state[p] for p in params], options,
                keys + ("step",), dict(by_device), sharded, hyper)
        return {device: lists for device, (lists, _) in by_device.items()}


def _group_grads(optimizer, index, params):
    """(grads, refs) of a group's params as ``local_grads`` gives them: from what the
    GradScaler's overflow check read just before this step, when it handed that over
    (``_attached.scaler_grads``, set by GradScaler.step), else read now."""
    handed = optimizer._attached.scaler_grads
    if handed is not None and not torch.compiler.is_compiling():
        start = sum(len(g["params"]) for g in optimizer.param_groups[:index])
        mine = handed.params[start:start + len(params)]
        if len(mine) == len(params) and all(map(operator.is_, mine, params)):
            return handed.grads[start:start + len(params)], handed.refs
    grads, _, _, _, refs, _ = local_grads(params)
    only = optimizer._attached.only
    if only is not None:  # (_step_params)
        grads = [g if p in only else None for p, g in zip(params, grads)]
    return grads, refs
