"""Checkpoints as torch's: state dicts with fp32 masters and moments whatever the memory mode,
loading from torch's optimizers and across memory modes, hooks as torch runs them, pickles
(MasterWeightOptimizer's ``state_dict``, ``load_state_dict`` and ``__setstate__``)."""
from itertools import chain
from typing import Dict

import torch

from fused_amp.optim import _memory, _quantize
from fused_amp.optim._checkpoint import check_loadable
from fused_amp.optim._grad_norm import CLIP_OPTIONS, DTensor
from fused_amp.optim._memory import MASTER as _MASTER, REMAINDER_KEYS as _REMAINDER_KEYS


def state_dict_of(optimizer, compact: bool, torch_state_dict):
    """``optimizer.state_dict(compact=compact)`` from torch's (``torch_state_dict``): its hooks
    run here, around the fp32 masters and moments put in place of the held state."""
    post_hooks = optimizer._optimizer_state_dict_post_hooks
    optimizer._optimizer_state_dict_post_hooks = type(post_hooks)()
    try:
        state_dict = torch_state_dict()
    finally:
        optimizer._optimizer_state_dict_post_hooks = post_hooks
    params = chain.from_iterable(g["params"] for g in optimizer.param_groups)
    ids: Dict[int, int] = {}  # torch's numbering: params in group order, each once
    for p in params:
        ids.setdefault(id(p), len(ids))
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    for p, state in optimizer.state.items():
        if not isinstance(p, torch.Tensor) or id(p) not in ids:
            continue
        if compact and _quantize.ABSMAX in state and DTensor is not None and isinstance(p, DTensor):
            raise ValueError(f"{type(optimizer).__name__}.state_dict(compact=True): a DTensor (FSDP2) param's "
                             "absmax rows are its rank's own and cannot be resharded; use state_dict()")
        packed = state if compact else _memory.unpacked_state(p, state, optimizer._state_keys_for(group_of[id(p)]))
        if any(key in state for key in _REMAINDER_KEYS):
            packed = {k: v for k, v in packed.items() if k not in _REMAINDER_KEYS}
            packed[_MASTER] = _memory.master_of(p, state)
        if packed is not state:
            state_dict["state"][ids[id(p)]] = packed
    for post_hook in post_hooks.values():
        result = post_hook(optimizer, state_dict)
        if result is not None:
            state_dict = result
    return state_dict


def load_into(optimizer, state_dict, torch_load_state_dict) -> None:
    """``optimizer.load_state_dict(state_dict)`` through torch's (``torch_load_state_dict``): its
    hooks run here, around the checks, torch's loading and the state brought to each group's
    memory mode."""
    optimizer._lists.forget()
    memory = [{k: g[k] for k in _memory.MEMORY_OPTIONS} for g in optimizer.param_groups]
    state_dict = state_dict.copy()
    pre_hooks = optimizer._optimizer_load_state_dict_pre_hooks
    post_hooks = optimizer._optimizer_load_state_dict_post_hooks
    for pre_hook in pre_hooks.values():
        result = pre_hook(optimizer, state_dict)
        if result is not None:
            state_dict = result
    loaded, saved_state = check_loadable(optimizer, state_dict, f"{type(optimizer).__name__}.load_state_dict")
    state_dict = dict(state_dict, state=saved_state)
    # torch's loading, with the hooks run here around it instead of inside it
    optimizer._optimizer_load_state_dict_pre_hooks = type(pre_hooks)()
    optimizer._optimizer_load_state_dict_post_hooks = type(post_hooks)()
    try:
        torch_load_state_dict(state_dict)
    finally:
        optimizer._optimizer_load_state_dict_pre_hooks = pre_hooks
        optimizer._optimizer_load_state_dict_post_hooks = post_hooks
    for group, options, loaded_options in zip(optimizer.param_groups, memory, loaded):
        group.update(options, **{key: loaded_options[key] for key in CLIP_OPTIONS})
    id_map = dict(zip(chain.from_iterable(g["params"] for g in state_dict["param_groups"]),
                      chain.from_iterable(g["params"] for g in optimizer.param_groups)))
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    for saved_id, p in id_map.items():
        if saved_id not in saved_state:
            continue
        state = optimizer.state[p]
        group = group_of[id(p)]
        moments = optimizer._state_keys_for(group)
        moment_dtype = torch.float32 if group["state_dtype"] in _quantize.CODE_DTYPES else group["state_dtype"]
        for key, value in saved_state[saved_id].items():
            if isinstance(value, torch.Tensor):
                # (4-bit codes of a compact checkpoint load as they are: _checkpoint._keeps_codes)
                dtype = (torch.uint8 if value.dtype == torch.uint8 else moment_dtype) if key in moments \
                    else torch.float32
                state[key] = _state_like(value, p, dtype)
        optimizer._complete_loaded_state(p, state)
        if _memory.quantized(p, group):  # fp32 moments to codes now, not at the next step
            _memory.bring_state(type(optimizer).__name__, p, group, state, moments)
    for post_hook in post_hooks.values():
        post_hook(optimizer)


def fill_options(optimizer) -> None:
    """After unpickling (torch's ``__setstate__``): the options a pickle of an older version lacks."""
    # pickles from before the clip options moved into the groups hold them as attributes
    legacy = {key: optimizer.__dict__.pop(key) for key in CLIP_OPTIONS if key in optimizer.__dict__}
    clip_defaults = dict({"max_grad_norm": None, "grad_norm_type": 2.0}, **legacy)
    # options added in later versions (of torch or of ours) take torch's defaults for
    # checkpoints that lack them, as torch's optimizers do
    for group in [optimizer.defaults] + optimizer.param_groups:
        for key, value in dict(optimizer._group_defaults, **clip_defaults).items():
            group.setdefault(key, value)
        optimizer._fix_group(group)


def _state_like(value: torch.Tensor, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A loaded state tensor in ``dtype`` on ``p``'s device, in ``p``'s layout where it has p's shape."""
    if value.shape == p.shape and value.dim() > 0:
        out = torch.empty_like(p, dtype=dtype, memory_format=torch.preserve_format)
        return out.copy_(value)
    return value.detach().to(device=p.device, dtype=dtype, copy=True).reshape(value.shape)
