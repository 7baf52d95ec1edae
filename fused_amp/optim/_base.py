"""What Adam, AdamW and SGD share: fp32 master weights, device-side state, the GradScaler
protocol, and state dicts that keep fp32 state fp32."""
from collections import defaultdict
from itertools import chain
from typing import Any, Dict, List, Optional

import torch

_HALF = (torch.float16, torch.bfloat16)


class MasterWeightOptimizer(torch.optim.Optimizer):
    """Base class: subclasses name their fp32 state and call their fused op in ``_update``.

    For each fp16/bf16 parameter (with ``master_weights=True``) the optimizer keeps an fp32 copy
    in ``state[p]["master_param"]``; the update happens there and the parameter receives
    ``master.to(p.dtype)`` (round to nearest even). All state is fp32 and lives on the
    parameter's device, the step count included, so a step never syncs with the host.

    A GradScaler (ours, or ``torch.amp.GradScaler``) may set ``grad_scale`` and ``found_inf``
    before calling :meth:`step` (``_step_supports_amp_scaling``): the grads are then unscaled
    inside the update, and a nonzero ``found_inf`` turns the step into a no-op on the device.
    """

    _step_supports_amp_scaling = True

    def __init__(self, params, defaults):
        self._lists_cache: Dict[int, Any] = {}
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        self._forget_lists()
        super().add_param_group(param_group)
        for i, p in enumerate(self.param_groups[-1]["params"]):
            if p.is_complex():
                raise ValueError(f"{type(self).__name__}: param {i} of group "
                                 f"{len(self.param_groups) - 1} is complex, which is not supported")
            if not p.is_floating_point():
                raise ValueError(f"{type(self).__name__}: param {i} of group "
                                 f"{len(self.param_groups) - 1} has dtype {p.dtype}; "
                                 "only float32, float16 and bfloat16 params are supported")

    # ---- state -------------------------------------------------------------------------
    def _state_keys_for(self, group) -> tuple:
        """The fp32 state tensors shaped like the param, zero-filled when a param first steps."""
        raise NotImplementedError

    def _init_state(self, p, group):
        state = self.state[p]
        if len(state) == 0 or "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        for key in self._state_keys_for(group):
            if key not in state or state[key] is None:
                state[key] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
        if group["master_weights"] and p.dtype in _HALF and "master_param" not in state:
            state["master_param"] = p.detach().to(torch.float32, memory_format=torch.preserve_format)
        return state

    def _device_lists(self, group) -> Dict[torch.device, Dict[str, list]]:
        """The params of ``group`` that have grads, with their state, per device.

        Building these lists costs a few microseconds per param; when every param of the group
        has a grad (the usual case) they are kept, and only the grads are gathered anew."""
        grads = [p.grad for p in group["params"]]
        keys = self._state_keys_for(group)
        # what the lists depend on besides the params: the state kept, and whether masters are
        valid_for = (keys, group["master_weights"])
        cached = self._lists_cache.get(id(group))
        if (cached is not None and cached[0] is group and cached[1] == valid_for
                and all(g is not None for g in grads)):
            for lists, indices in cached[2].values():
                lists["grads"] = [grads[i] for i in indices]
            return {device: lists for device, (lists, _) in cached[2].items()}
        by_device: Dict[torch.device, Any] = defaultdict(lambda: (defaultdict(list), []))
        for i, p in enumerate(group["params"]):
            if grads[i] is None:
                continue
            state = self._init_state(p, group)
            lists, indices = by_device[p.device]
            indices.append(i)
            lists["params"].append(p)
            lists["grads"].append(grads[i])
            lists["master_params"].append(state.get("master_param"))
            lists["steps"].append(state["step"])
            for key in keys:
                lists[key].append(state[key])
        if all(g is not None for g in grads):
            self._lists_cache[id(group)] = (group, valid_for, dict(by_device))
        return {device: lists for device, (lists, _) in by_device.items()}

    def _forget_lists(self):
        self._lists_cache = {}

    # ---- the GradScaler protocol ----------------------------------------------------------
    def _scaler_tensors(self, device):
        """(inv_scale, found_inf) on ``device`` from what a GradScaler set, else (None, None)."""
        grad_scale: Optional[torch.Tensor] = getattr(self, "grad_scale", None)
        found_inf: Optional[torch.Tensor] = getattr(self, "found_inf", None)
        inv_scale = None
        if grad_scale is not None:
            # as torch's unscale_ forms it: reciprocal in double, rounded to fp32
            inv_scale = grad_scale.double().reciprocal().float().to(device, non_blocking=True)
        if found_inf is not None:
            found_inf = found_inf.to(device, dtype=torch.float32, non_blocking=True)
        return inv_scale, found_inf

    @torch.no_grad()
    def step(self, closure=None):
        """Perform a single optimization step. ``closure`` re-evaluates the model and returns
        the loss (optional)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for device, lists in self._device_lists(group).items():
                inv_scale, found_inf = self._scaler_tensors(device)
                lr = group["lr"]
                lr_tensor = lr if isinstance(lr, torch.Tensor) else None
                self._update(group, lists, float(lr) if lr_tensor is None else 0.0, lr_tensor,
                             inv_scale, found_inf)
        return loss

    def _update(self, group, lists, lr, lr_tensor, inv_scale, found_inf):
        raise NotImplementedError

    # ---- checkpoints -----------------------------------------------------------------------
    def load_state_dict(self, state_dict):
        """Load a state dict of this optimizer or of the matching ``torch.optim`` one.

        torch casts loaded state to each param's dtype; here every state tensor stays fp32 (the
        masters and moments of a bf16 param would lose their precision otherwise), ``step``
        moves to the param's device, and state missing from a torch checkpoint (masters) is
        created from the current params at the next step.
        """
        self._forget_lists()
        saved_groups = state_dict["param_groups"]
        saved_state = state_dict["state"]
        super().load_state_dict(state_dict)
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in self.param_groups)))
        for saved_id, p in id_map.items():
            if saved_id not in saved_state:
                continue
            state = self.state[p]
            for key, value in saved_state[saved_id].items():
                if isinstance(value, torch.Tensor):
                    state[key] = value.detach().to(device=p.device, dtype=torch.float32).clone(
                        memory_format=torch.contiguous_format if value.dim() == 0
                        else torch.preserve_format)
            self._complete_loaded_state(p, state)
        for group in self.param_groups:
            group.setdefault("master_weights", self.defaults["master_weights"])

    def _complete_loaded_state(self, p, state):
        """Adapt the state of a ``torch.optim`` checkpoint (subclasses add what it lacks)."""
        if "step" in state:
            state["step"] = state["step"].reshape(())

    def __setstate__(self, state):
        super().__setstate__(state)
        self._forget_lists()
        for group in self.param_groups:
            group.setdefault("master_weights", True)


def check_common(lr, weight_decay):
    """The checks torch.optim makes of every optimizer, with its messages."""
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
    elif not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def lists_or_empty(lists, key, needed) -> List:
    return lists[key] if needed else []
