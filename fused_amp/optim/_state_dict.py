"""Checkpoints as torch's: state dicts with fp32 masters and moments whatever the memory mode,
loading from torch's optimizers and across memory modes, hooks as torch runs them, pickles."""
from itertools import chain
from typing import Dict

import torch

from fused_amp.optim import _memory, _quantize
from fused_amp.optim._attached import Attached
from fused_amp.optim._checkpoint import check_loadable
from fused_amp.optim._clipping import ClipState
from fused_amp.optim._grad_norm import CLIP_OPTIONS, DTensor
from fused_amp.optim._memory import MASTER as _MASTER, REMAINDER_KEYS as _REMAINDER_KEYS


class TorchStateDict:
    """MasterWeightOptimizer's ``state_dict``, ``load_state_dict`` and ``__setstate__``."""

    def state_dict(self, *, compact: bool = False):
        """torch's state dict, in which a param kept as bf16 + remainder
        (``master_weights="remainder"``) has its fp32 ``master_param``, as with
        ``master_weights=True``, and 8-bit state its fp32 moments: checkpoints load across
        memory modes and, through :func:`fused_amp.optim.export_fp32`, into ``torch.optim``.
        State-dict hooks behave as torch's; post-hooks see the fp32 masters.

        Args:
            compact (bool, optional): keep 8-bit state as it is held, uint8 codes under the
                moments' names and ``state_absmax``, about a quarter of the fp32 moments'
                bytes; such a checkpoint loads into this library's optimizers only (any memory
                mode; resumes bit for bit), not into ``torch.optim``, and not for DTensor
                (FSDP2) params, whose absmax rows are each rank's own (default: False)
        """
        post_hooks = self._optimizer_state_dict_post_hooks
        self._optimizer_state_dict_post_hooks = type(post_hooks)()
        try:
            state_dict = super().state_dict()
        finally:
            self._optimizer_state_dict_post_hooks = post_hooks
        params = chain.from_iterable(g["params"] for g in self.param_groups)
        ids: Dict[int, int] = {}  # torch's numbering: params in group order, each once
        for p in params:
            ids.setdefault(id(p), len(ids))
        group_of = {id(p): g for g in self.param_groups for p in g["params"]}
        for p, state in self.state.items():
            if not isinstance(p, torch.Tensor) or id(p) not in ids:
                continue
            if compact and _quantize.ABSMAX in state and DTensor is not None and isinstance(p, DTensor):
                raise ValueError(f"{type(self).__name__}.state_dict(compact=True): a DTensor (FSDP2) param's "
                                 "absmax rows are its rank's own and cannot be resharded; use state_dict()")
            packed = state if compact else _memory.unpacked_state(p, state, self._state_keys_for(group_of[id(p)]))
            if any(key in state for key in _REMAINDER_KEYS):
                packed = {k: v for k, v in packed.items() if k not in _REMAINDER_KEYS}
                packed[_MASTER] = _memory.master_of(p, state)
            if packed is not state:
                state_dict["state"][ids[id(p)]] = packed
        for post_hook in post_hooks.values():
            result = post_hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def load_state_dict(self, state_dict):
        """Load a state dict of this optimizer or of the matching ``torch.optim`` one.

        torch casts loaded state to each param's dtype; here the moments take the group's
        ``state_dtype`` and every other state tensor is fp32 (the masters and moments of a bf16
        param would lose their precision otherwise), on the param's device and in its memory
        layout; state missing from a torch checkpoint (masters) is created from the current
        params at the next step (from rounded weights, if the model loaded an fp32 checkpoint:
        :func:`fused_amp.optim.import_fp32` takes the fp32 weights as the masters instead). The memory options (``master_weights``, ``state_dtype``,
        ``stochastic_rounding``) stay this optimizer's: a checkpoint of any mode loads into any
        other. Load-state-dict hooks behave as torch's: a pre-hook's returned dict is what gets
        loaded, and post-hooks see the final state.
        """
        self._forget_lists()
        memory = [{k: g[k] for k in _memory.MEMORY_OPTIONS} for g in self.param_groups]
        state_dict = state_dict.copy()
        pre_hooks = self._optimizer_load_state_dict_pre_hooks
        post_hooks = self._optimizer_load_state_dict_post_hooks
        for pre_hook in pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        loaded, saved_state = check_loadable(self, state_dict, f"{type(self).__name__}.load_state_dict")
        state_dict = dict(state_dict, state=saved_state)
        # torch's loading, with the hooks run here around it instead of inside it
        self._optimizer_load_state_dict_pre_hooks = type(pre_hooks)()
        self._optimizer_load_state_dict_post_hooks = type(post_hooks)()
        try:
            super().load_state_dict(state_dict)
        finally:
            self._optimizer_load_state_dict_pre_hooks = pre_hooks
            self._optimizer_load_state_dict_post_hooks = post_hooks
        for group, options, loaded_options in zip(self.param_groups, memory, loaded):
            group.update(options, **{key: loaded_options[key] for key in CLIP_OPTIONS})
        id_map = dict(zip(chain.from_iterable(g["params"] for g in state_dict["param_groups"]),
                          chain.from_iterable(g["params"] for g in self.param_groups)))
        group_of = {id(p): g for g in self.param_groups for p in g["params"]}
        for saved_id, p in id_map.items():
            if saved_id not in saved_state:
                continue
            state = self.state[p]
            group = group_of[id(p)]
            moments = self._state_keys_for(group)
            moment_dtype = torch.float32 if group["state_dtype"] in _quantize.CODE_DTYPES else group["state_dtype"]
            for key, value in saved_state[saved_id].items():
                if isinstance(value, torch.Tensor):
                    # (4-bit codes of a compact checkpoint load as they are: _checkpoint._keeps_codes)
                    dtype = (torch.uint8 if value.dtype == torch.uint8 else moment_dtype) if key in moments \
                        else torch.float32
                    state[key] = _state_like(value, p, dtype)
            self._complete_loaded_state(p, state)
            if _memory.quantized(p, group):  # fp32 moments to codes now, not at the next step
                _memory.bring_state(type(self).__name__, p, group, state, moments)
        for post_hook in post_hooks.values():
            post_hook(self)

    def _complete_loaded_state(self, p, state):
        """Adapt the state of a ``torch.optim`` checkpoint (subclasses add what it lacks)."""
        step = state.get("step")
        if step is not None and not isinstance(step, torch.Tensor):  # a legacy Python number
            state["step"] = torch.tensor(float(step), dtype=torch.float32, device=p.device)

    def __setstate__(self, state):
        super().__setstate__(state)
        self._lists_cache = {}  # (torch pickles the defaults, state and groups only)
        # pickles from before the clip options moved into the groups hold them as attributes
        legacy = {key: self.__dict__.pop(key) for key in CLIP_OPTIONS if key in self.__dict__}
        clip_defaults = dict({"max_grad_norm": None, "grad_norm_type": 2.0}, **legacy)
        self._clip = ClipState()
        self._attached = Attached()
        # options added in later versions (of torch or of ours) take torch's defaults for
        # checkpoints that lack them, as torch's optimizers do
        for group in [self.defaults] + self.param_groups:
            for key, value in dict(self._group_defaults, **clip_defaults).items():
                group.setdefault(key, value)
            self._fix_group(group)

    def _fix_group(self, group):
        """Group options a subclass forces whatever the checkpoint says (AdamW: decoupled)."""


def _state_like(value: torch.Tensor, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A loaded state tensor in ``dtype`` on ``p``'s device, in ``p``'s layout where it has p's shape."""
    if value.shape == p.shape and value.dim() > 0:
        out = torch.empty_like(p, dtype=dtype, memory_format=torch.preserve_format)
        return out.copy_(value)
    return value.detach().to(device=p.device, dtype=dtype, copy=True).reshape(value.shape)
