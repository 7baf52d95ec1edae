"""What Adam, AdamW and SGD share: fp32 master weights, device-side state, the GradScaler
protocol, torch's constructor flags, and state dicts that keep fp32 state fp32."""
import operator
from collections import defaultdict
from itertools import chain, repeat
from typing import Any, Dict, List, Optional

import torch

from fused_amp import _C, _scaling, ops
from fused_amp.optim import _memory, _quantize
from fused_amp.optim._checkpoint import check_loadable
from fused_amp.optim._grad_norm import (CLIP_OPTIONS, DTensor, check_clip_options, check_same_clip_options,
                                        local_grads, local_shard, local_shards, total_grad_norm)
from fused_amp.optim._memory import MASTER as _MASTER, REMAINDER as _REMAINDER, REMAINDER8 as _REMAINDER8

_HALF = (torch.float16, torch.bfloat16)
_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)
_MASTER_KEYS = (_MASTER, _REMAINDER, _REMAINDER8)  # a param holds at most one of them
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


class _GroupLists:
    """The per-device tensor lists of one param group, kept between eager steps.

    Gathering them costs a few microseconds per param, so they are kept while nothing they were
    built from has changed: the group's params (same objects, same order, and for DTensors the
    same local tensors), the optimizer's ``state`` mapping, each param's state dict and every
    tensor in it, and the group options that decide which state exists. Checking that is one C
    pass over the params (``fused_amp._C.lists_unchanged``).
    """

    def __init__(self, group, params, state, state_dicts, options, keys, by_device, sharded):
        self.group = group
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

    def still_valid(self, group, params, state, options) -> bool:
        return (self.group is group and self.state is state and self.options == options
                and _C.lists_unchanged(params, state, DTensor, self.held))


class _ClipState:
    """What clipping keeps between calls. A plain object, not attributes of the optimizer:
    torch.compile (2.11) refuses attribute writes on an optimizer inside a compiled step."""

    def __init__(self):
        # (norm, max_norm, still_scaled) from clip_grad_norm_, for the next step
        self.pending = None
        self.last_norm: Optional[torch.Tensor] = None

    def record(self, norm, max_norm, still_scaled=False):
        """A norm taken for a step: logged, and (norm, max_norm, still_scaled) kept for that
        step. ``still_scaled``: the norm is of grads that a scaler we do not drive may have
        scaled (torch's GradScaler without ``unscale_``); the step divides it by the scale it
        receives."""
        self.last_norm = norm
        return norm, max_norm, still_scaled


class MasterWeightOptimizer(torch.optim.Optimizer):
    """Base class: subclasses name their fp32 state and call their fused op in ``_update``.

    For each fp16/bf16 parameter (with ``master_weights=True``) the optimizer keeps an fp32 copy
    in ``state[p]["master_param"]``; the update happens there and the parameter receives
    ``master.to(p.dtype)`` (round to nearest even). With ``master_weights="remainder"`` (bf16
    params) the master is kept exactly in 2 bytes instead of 4: the param holds its high half,
    rounded to nearest with ties away from zero, and ``state[p]["master_remainder"]`` (int16) its
    low half; ``state_dict()`` still holds an fp32 ``master_param``. The state is fp32, or bf16
    with ``state_dtype=torch.bfloat16`` (math in fp32, stored rounded to nearest even, or
    stochastically with ``stochastic_rounding=True``); it lives on the parameter's device, the
    step count (fp32) included, so a step never syncs with the host.

    A GradScaler (ours, or ``torch.amp.GradScaler``) may set ``grad_scale`` and ``found_inf``
    before calling :meth:`step` (``_step_supports_amp_scaling``): the grads are then unscaled
    inside the update (and left unscaled in ``p.grad``, as torch's fused optimizers leave them,
    unless ``unscale_grads=False``), and a nonzero ``found_inf`` turns the step into a no-op on
    the device.

    Gradient clipping happens inside the step too: with ``max_grad_norm`` every step clips, and
    :meth:`clip_grad_norm_` clips the next step. The norm of the unscaled grads comes from one
    read-only pass, which is also the GradScaler's overflow check; the step multiplies the grads
    by ``min(1, max_norm / (norm + 1e-6))`` in the same multiply as the inverse scale.
    """

    _step_supports_amp_scaling = True
    # What a loaded group lacking an option gets (subclasses: as torch's __setstate__ sets it)
    _group_defaults: Dict[str, Any] = {"master_weights": True, "unscale_grads": True,
                                       "state_dtype": torch.float32, "stochastic_rounding": False,
                                       "rounding_seed": 0, "min_8bit_size": _quantize.MIN_8BIT_SIZE}

    def __init__(self, params, defaults, max_grad_norm=None, grad_norm_type=2.0):
        check_clip_options(max_grad_norm, grad_norm_type)
        self._lists_cache: Dict[int, _GroupLists] = {}  # by the group's index in param_groups
        self._clip = _ClipState()
        # group options, as torch keeps every option, so that checkpoints carry them
        defaults = dict(defaults, max_grad_norm=max_grad_norm, grad_norm_type=float(grad_norm_type))
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        self._forget_lists()
        super().add_param_group(param_group)
        try:
            self._check_group(len(self.param_groups) - 1, self.param_groups[-1])
        except Exception:
            self.param_groups.pop()  # as torch's checks, which run before the group is added
            raise

    def _check_group(self, index, group):
        name = type(self).__name__
        for i, p in enumerate(group["params"]):
            if p.dtype not in _SUPPORTED:
                kind = "complex" if p.is_complex() else f"dtype {p.dtype}"
                raise ValueError(f"{name}: param {i} of group {index} is {kind}; "
                                 "only float32, float16 and bfloat16 params are supported")
        group["rounding_seed"] = _memory.check_memory_options(
            name, group["master_weights"], group["state_dtype"], group["stochastic_rounding"],
            group["rounding_seed"], group["min_8bit_size"])
        _memory.check_group_params(name, group, index)
        check_clip_options(group["max_grad_norm"], group["grad_norm_type"])
        group["grad_norm_type"] = float(group["grad_norm_type"])
        check_same_clip_options(name, self.param_groups[:index] + [group])

    # ---- clipping options: group options, the same in every group -------------------------
    @property
    def max_grad_norm(self) -> Optional[float]:
        """The total norm the grads are clipped to at every step (None: no clipping), kept in
        every param group (and so in checkpoints); setting it sets it in all groups."""
        return self._clip_option("max_grad_norm")

    @max_grad_norm.setter
    def max_grad_norm(self, value):
        self._set_clip_option("max_grad_norm", value)

    @property
    def grad_norm_type(self) -> float:
        """The norm of ``max_grad_norm`` (2.0, 1.0 or inf), a group option as ``max_grad_norm``."""
        return self._clip_option("grad_norm_type")

    @grad_norm_type.setter
    def grad_norm_type(self, value):
        self._set_clip_option("grad_norm_type", value)

    def _clip_option(self, key):
        groups = self.param_groups
        return groups[0][key] if groups else self.defaults[key]

    def _set_clip_option(self, key, value):
        options = {"max_grad_norm": self.max_grad_norm, "grad_norm_type": self.grad_norm_type, key: value}
        check_clip_options(options["max_grad_norm"], options["grad_norm_type"])
        value = value if key == "max_grad_norm" else float(value)
        for group in [self.defaults] + self.param_groups:
            group[key] = value

    # ---- state -------------------------------------------------------------------------
    @classmethod
    def _check_hyperparameters(cls, options):
        """torch's checks of the optimizer's arguments, with its messages and in its order, on a
        dict of them: the constructor's, or a loaded group's."""
        raise NotImplementedError

    def _state_keys_for(self, group) -> tuple:
        """The state tensors shaped like the param, zero-filled when a param first steps: those
        its step op keeps with the group's hyperparameters (the C++ descriptor says which)."""
        return tuple(key for key, _ in ops.kept_states(self._kernel, self._hyper(group)))

    def _initial_state(self, group) -> dict:
        """The value each state starts from, by key, where it is not zero."""
        return {}

    # whether torch's checkpoints of this optimizer hold a step count beside the moments
    _step_count_saved = True

    def _init_state(self, p, group):
        """Create what a param's step needs (moments in the group's state dtype), and bring a
        master that a checkpoint or a change of ``master_weights`` left in another form (fp32,
        remainder, 24-bit) to the group's."""
        state = self.state[p]
        step = state.get("step")
        if not isinstance(step, torch.Tensor):  # new, or a legacy checkpoint's Python number
            state["step"] = torch.tensor(float(step or 0), dtype=torch.float32, device=p.device)
        elif step.device != p.device:  # e.g. moved to the CPU by ZeroRedundancyOptimizer
            state["step"] = step.to(p.device, torch.float32).reshape(())
        if self._scalar_state:  # as the step: a 0-dim fp32 tensor on the param's device
            key, initial = self._scalar_state
            value = state.get(key)
            if not isinstance(value, torch.Tensor):  # new, or a Python number of a checkpoint
                state[key] = torch.tensor(float(initial if value is None else value), dtype=torch.float32,
                                          device=p.device)
            elif value.device != p.device or value.dtype != torch.float32:
                state[key] = value.to(p.device, torch.float32).reshape(())
        _memory.bring_state(type(self).__name__, p, group, state, self._state_keys_for(group),
                            self._initial_state(group))
        _memory.bring_master(p, group, state)
        return state

    def _device_lists(self, index, group) -> Dict[torch.device, Dict[str, list]]:
        """The params of ``group`` that have grads, with their state, per device.

        Rebuilt whenever the params, the state or the options it depends on changed (see
        _GroupLists); otherwise only the grads are gathered anew. A step that torch.compile traces
        builds them and keeps nothing: the compiled step runs none of this again."""
        params = group["params"]
        grads, grad_refs = self._group_grads(index, params)  # (local shards of DTensor grads)
        keys = self._state_keys_for(group) + ((self._scalar_state[0],) if self._scalar_state else ())
        options = (keys, group["master_weights"], group["state_dtype"], group["min_8bit_size"])
        keep = all(map(operator.is_not, grads, repeat(None))) and not torch.compiler.is_compiling()
        cached = self._lists_cache.get(index) if keep else None
        if cached is not None and cached.still_valid(group, params, self.state, options):
            for lists, indices in cached.by_device.values():
                lists["grads"] = grads if len(indices) == len(grads) else list(map(grads.__getitem__, indices))
                lists["grad_refs"] = grad_refs
            return {device: lists for device, (lists, _) in cached.by_device.items()}
        by_device: Dict[torch.device, Any] = defaultdict(lambda: (defaultdict(list), []))
        for i, p in enumerate(params):
            if grads[i] is None:
                continue
            state = self._init_state(p, group)
            lists, indices = by_device[p.device]
            indices.append(i)
            lists["params"].append(p)
            lists["grads"].append(grads[i])
            lists["master_params"].append(_master_entry(state))
            lists["steps"].append(state["step"])
            lists["state_absmaxes"].append(_absmax_entry(state))
            for key in keys:
                lists[key].append(state[key])
        # no masters at all (fp32 params): an empty list, which the op takes for "none" (and which
        # torch.compile's functionalization handles, unlike a list of Nones)
        for lists, _ in by_device.values():
            for key in ("master_params", "state_absmaxes"):
                if not any(m is not None for m in lists[key]):
                    lists[key] = []
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
            self._plan_lists(lists)
        # drop what is kept for this group (step() drops that of groups no longer in the optimizer)
        self._lists_cache.pop(index, None)
        if keep:
            self._lists_cache[index] = _GroupLists(
                group, params, self.state, [self.state[p] for p in params], options,
                keys + ("step",), dict(by_device), sharded)
        return {device: lists for device, (lists, _) in by_device.items()}

    def _group_grads(self, index, params):
        """(grads, refs) of a group's params as ``local_grads`` gives them: from what the
        GradScaler's overflow check read just before this step, when it handed that over
        (``_scaler_grads``, set by GradScaler.step), else read now."""
        handed = self.__dict__.get("_scaler_grads")
        if handed is not None and not torch.compiler.is_compiling():
            start = sum(len(g["params"]) for g in self.param_groups[:index])
            mine = handed.params[start:start + len(params)]
            if len(mine) == len(params) and all(map(operator.is_, mine, params)):
                return handed.grads[start:start + len(params)], handed.refs
        grads, _, _, _, refs, _ = local_grads(params)
        only = self.__dict__.get("_only")
        if only is not None:  # (_step_params)
            grads = [g if p in only else None for p, g in zip(params, grads)]
        return grads, refs

    def _plan_lists(self, lists) -> None:
        """Called on each device's lists when they are built; a subclass adds to them what
        depends on the params alone, kept with the lists while they stay cached."""

    def _forget_lists(self):
        self.__dict__.setdefault("_lists_cache", {}).clear()

    # ---- the GradScaler protocol ----------------------------------------------------------
    def _inv_scale(self) -> Optional[torch.Tensor]:
        """1/scale of what a GradScaler set, or None."""
        grad_scale: Optional[torch.Tensor] = getattr(self, "grad_scale", None)
        return None if grad_scale is None else _scaling.inv_scale(grad_scale)

    def _scaler_tensors(self, device):
        """(inv_scale, found_inf) on ``device`` from what a GradScaler set, else (None, None)."""
        found_inf: Optional[torch.Tensor] = getattr(self, "found_inf", None)
        inv_scale = self._inv_scale()
        if inv_scale is not None:
            inv_scale = inv_scale.to(device, non_blocking=True)
        if found_inf is not None:
            found_inf = found_inf.to(device, dtype=torch.float32, non_blocking=True)
        return inv_scale, found_inf

    @torch.no_grad()
    def step(self, closure=None):
        """Perform a single optimization step. ``closure`` re-evaluates the model and returns
        the loss (optional). While the params step in backward
        (:func:`fused_amp.optim.step_in_backward`) it only runs the closure: they have stepped."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.__dict__.get("_in_backward") is not None:  # the params stepped in backward (in_backward.py)
            return loss
        self._fused_step()
        return loss

    @torch.no_grad()
    def _step_params(self, params) -> None:
        """One step of ``params`` only (those of them with grads), as :meth:`step` steps them:
        step_in_backward's, for the params whose grads have arrived."""
        self._only = set(params)
        try:
            self._fused_step()
        finally:
            self._only = None

    def _fused_step(self) -> None:
        if getattr(self, "found_inf", None) is None and not torch.compiler.is_compiling():
            _scaling.stepped(self)  # without a GradScaler (host bookkeeping, left out when traced)
        max_grad_norm, grad_norm_type = check_same_clip_options(type(self).__name__, self.param_groups)
        inv_scale = self._inv_scale()
        clip, self._clip.pending = self._clip.pending, None
        if clip is None and max_grad_norm is not None:
            norm, _ = total_grad_norm(self, grad_norm_type, inv_scale)
            clip = self._clip.record(norm, max_grad_norm)
        elif clip is not None and clip[2] and inv_scale is not None:
            # torch's GradScaler hands the step the scale of grads clip_grad_norm_ saw scaled:
            # the norm (the tensor it returned) becomes the unscaled one, in place
            clip[0].mul_(inv_scale.to(clip[0].device))
        cache, live = self._lists_cache, len(self.param_groups)
        if len(cache) > live:  # groups were removed: let go of their tensors (the cache holds them)
            for stale in [k for k in cache if k >= live]:
                del cache[stale]
        calls = []
        for index, group in enumerate(self.param_groups):
            for device, lists in self._device_lists(index, group).items():
                inv_scale, found_inf = self._scaler_tensors(device)
                lr = group["lr"]
                lr_tensor = lr if isinstance(lr, torch.Tensor) else None
                scalars = dict(lr=float(lr) if lr_tensor is None else 0.0, lr_tensor=lr_tensor,
                               inv_scale=inv_scale, found_inf=found_inf,
                               unscale_grads=group["unscale_grads"],
                               rounding_seed=_memory.rounding_seed_of(group, self._running_sums),
                               stochastic_codes=_memory.stochastic_codes(group, self._running_sums))
                if clip is not None:
                    scalars.update(grad_norm=clip[0].to(device, non_blocking=True),
                                   max_grad_norm=clip[1])
                calls.append((group, lists, scalars))
        # Each op checks its arguments before it writes; with several ops (groups, devices),
        # all are checked before the first runs, so a bad grad anywhere changes nothing.
        try:
            if len(calls) > 1:
                for group, lists, scalars in calls:
                    self._update(group, lists, scalars, check_only=True)
            for group, lists, scalars in calls:
                self._update(group, lists, scalars, check_only=False)
        finally:
            # the grads are this step's: the cached lists keep them no longer, so that zero_grad()
            # frees them as it does with torch's optimizers
            for _, lists, _ in calls:
                lists["grads"], lists["grad_refs"] = [], None

    # ---- gradient clipping ------------------------------------------------------------------
    @torch.compiler.disable  # eager under torch.compile, as GradScaler.step (whose pass it may be)
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False, foreach: Optional[bool] = None) -> torch.Tensor:
        r"""Clip the gradients of this optimizer's params by their total norm, in the next step.

        The counterpart of ``torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)`` over
        this optimizer's params, with its return value: the total norm of the unscaled grads
        (before clipping), a 0-dim float32 tensor on the params' device, computed without a host
        sync. Call it where torch's is called, between backward and :meth:`step`, with or without
        ``scaler.unscale_(optimizer)`` before it: scaled grads are unscaled in the norm by the
        GradScaler that scaled the loss (``fused_amp.GradScaler``), and that pass is also the
        scaler's overflow check. ``torch.amp.GradScaler`` (which refuses to unscale fp16 grads)
        shows its scale to the optimizer only in ``scaler.step(optimizer)``: without ``unscale_``
        the norm is taken of the scaled grads and divided, in place, by the scale that step
        receives, so the clip is right, and the returned tensor holds the unscaled norm once
        ``scaler.step`` has run (read it after the step). Instead of rewriting the grads, the clip coefficient
        ``min(1, max_norm / (total_norm + 1e-6))`` is applied by the next :meth:`step`, which
        leaves the clipped grads in ``p.grad`` as torch does. ``foreach`` is accepted and
        ignored (one fused pass either way); ``zero_grad`` drops a clip not yet applied.
        """
        if self.__dict__.get("_in_backward") is not None:
            raise RuntimeError(f"clip_grad_norm_: {type(self).__name__} steps in backward (step_in_backward): each "
                               "param has stepped before the global norm of the grads could be known")
        scaler = _scaling.scaler_of(self)
        inv_scale = self._inv_scale()
        if scaler is not None:
            norm = scaler._grad_norm_pass(self, norm_type)
        else:
            norm, _ = total_grad_norm(self, norm_type, inv_scale)
        if error_if_nonfinite and bool(norm.isnan() | norm.isinf()):
            raise RuntimeError(
                f"The total norm of order {float(norm_type)} for gradients from `parameters` is "
                "non-finite, so it cannot be clipped. To disable this error and scale the gradients "
                "by the non-finite norm anyway, set `error_if_nonfinite=False`")
        still_scaled = scaler is None and inv_scale is None and norm_type != 0.0
        self._clip.pending = self._clip.record(norm, float(max_norm), still_scaled)
        return norm

    def _clip_before_step(self, scaler) -> bool:
        """Called by GradScaler.step before it checks the grads: with ``max_grad_norm`` and no
        clip pending, the norm pass runs now and serves as the scaler's overflow check. True
        when it ran."""
        max_grad_norm, grad_norm_type = check_same_clip_options(type(self).__name__, self.param_groups)
        if max_grad_norm is None or self._clip.pending is not None:
            return False
        self._clip.pending = self._clip.record(scaler._grad_norm_pass(self, grad_norm_type),
                                               max_grad_norm)
        return True

    def _drop_pending_clip(self):
        """A clip belongs to the step it was taken for (GradScaler, skipping on the host)."""
        self._clip.pending = None

    @property
    def last_grad_norm(self) -> Optional[torch.Tensor]:
        """The pre-clip total norm of the unscaled grads at the latest clipped step (0-dim fp32
        tensor on the params' device), for logging; None before any."""
        return self._clip.last_norm

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's; does nothing while the params step in backward (their grads are freed there)."""
        if self.__dict__.get("_in_backward") is not None:
            return
        self._clip.pending = None
        super().zero_grad(set_to_none)

    # the optimizer's name in the step op's table (fused_amp.ops.optimizers()): by default the
    # class's name in lower case, or its base's (AdamW: "adam"), set by __init_subclass__
    _kernel = ""
    # its per-param scalar state, as (key, initial value) (NAdam's mu_product), or None: the table's
    _scalar_state = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_kernel" not in cls.__dict__ and cls.__name__.lower() in ops.optimizers():
            cls._kernel = cls.__name__.lower()
        entry = ops.optimizers().get(cls._kernel)
        if entry is not None:
            cls._scalar_state = (entry["scalar"], entry["scalar_initial"]) if entry["scalar"] else None
    # whether its state is a running sum, which rounds stochastically by default when stored in
    # bf16 or 8 bits (rounded to nearest, increments below half a step would be lost)
    _running_sums = False

    def _hyper(self, group) -> dict:
        """The step op's hyperparameters of a group, by the names of its table entry."""
        raise NotImplementedError

    def _counts_steps(self, group, scalars) -> bool:
        """Whether the step counts go to the op (they always advance in the state)."""
        return True

    def _update(self, group, lists, scalars, check_only):
        """Run (or with ``check_only`` validate) the fused op on one device's lists; ``scalars``
        holds lr, lr_tensor, inv_scale, found_inf, unscale_grads and, when clipping, grad_norm and
        max_grad_norm."""
        keys = self._state_keys_for(group)
        scalar_key = self._scalar_state[0] if self._scalar_state else None
        ops.step_(self._kernel, lists["params"], lists["grads"], lists["master_params"],
                  [lists[key] for key in keys], lists_or_empty(lists, "steps", self._counts_steps(group, scalars)),
                  hyper=self._hyper(group), state_absmaxes=lists_or_empty(lists, "state_absmaxes", bool(keys)),
                  scalar_states=lists_or_empty(lists, scalar_key, scalar_key is not None),
                  check_only=check_only, **scalars)

    # ---- checkpoints -----------------------------------------------------------------------
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
            if _REMAINDER in state or _REMAINDER8 in state:
                packed = {k: v for k, v in packed.items() if k not in (_REMAINDER, _REMAINDER8)}
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
            moment_dtype = torch.float32 if group["state_dtype"] == torch.uint8 else group["state_dtype"]
            for key, value in saved_state[saved_id].items():
                if isinstance(value, torch.Tensor):
                    dtype = moment_dtype if key in moments else torch.float32
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
        self._forget_lists()
        # pickles from before the clip options moved into the groups hold them as attributes
        legacy = {key: self.__dict__.pop(key) for key in CLIP_OPTIONS if key in self.__dict__}
        clip_defaults = dict({"max_grad_norm": None, "grad_norm_type": 2.0}, **legacy)
        self._clip = _ClipState()
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


def check_lr(lr):
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")


def check_betas(betas):
    for i in (0, 1):
        if not 0.0 <= betas[i] < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {betas[i]}")


def check_eps(eps):
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")


def check_weight_decay(weight_decay):
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def check_torch_flags(name: str, foreach, fused, differentiable):
    """torch's ``foreach``/``fused``/``capturable`` are accepted (the step is always fused and
    capturable); what cannot apply is refused with torch's errors, or a clear one."""
    if differentiable:
        raise RuntimeError(f"{name}: differentiable=True is not supported: the fused step updates "
                           "the params in place, outside autograd")
    if fused and foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")


def lists_or_empty(lists, key, needed) -> List:
    return lists[key] if needed else []
