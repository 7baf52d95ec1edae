"""A drop-in replacement for torch.amp.GradScaler, backed by the fused kernels."""
from __future__ import annotations

import inspect
import itertools
import math
import numbers
import operator
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch
from torch.amp.grad_scaler import OptState
from torch.optim.optimizer import _global_optimizer_pre_hooks

from fused_amp import _scaling, ops
from fused_amp.optim import in_backward
from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._grad_norm import Gathered, gather, total_grad_norm
from fused_amp.optim._stages import stage_groups

try:  # torch builds without distributed support lack it
    from torch.distributed.optim import ZeroRedundancyOptimizer as _ZeroRedundancyOptimizer
except ImportError:  # pragma: no cover
    _ZeroRedundancyOptimizer = None

__all__ = ["GradScaler", "OverflowReport"]


@dataclass
class OverflowReport:
    """What :meth:`GradScaler.overflow_report` returns.

    Attributes:
        skipped_steps (int): the steps skipped for inf/NaN grads so far.
        last_overflow_params (list of str): the names (``param[i]`` for params of modules not
            watched with :meth:`GradScaler.watch`) of the params whose grads held inf/NaN in
            the latest skipped step.
    """
    skipped_steps: int
    last_overflow_params: List[str] = field(default_factory=list)

    def __str__(self):
        names = ", ".join(self.last_overflow_params) or "none recorded"
        return f"{self.skipped_steps} skipped steps; last overflow in: {names}"


class _HostFlag:
    """A boolean computed on the device and read on the host without a sync: the value is
    copied asynchronously and read at the next call, once the copy has landed."""

    def __init__(self):
        self._host = None
        self._event = None

    def record(self, value: torch.Tensor):
        if value.device.type != "cuda":
            self._host, self._event = value.clone(), None
            return
        if self._host is None:
            self._host = torch.zeros((), dtype=torch.bool, pin_memory=True)
        self._host.copy_(value, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def ready_value(self) -> bool:
        if self._host is None or (self._event is not None and not self._event.query()):
            return False
        return bool(self._host)


_INT32_MAX = 2 ** 31 - 1


def _positive_in_fp32(value) -> bool:
    """Whether ``value`` is positive and finite once rounded to float32 (what the scale is)."""
    return 0 < torch.tensor(float(value), dtype=torch.float32).item() < math.inf


def _check_tracker(name: str, value):
    """A tracker (a count kept in int32 on the device): an integer in [0, 2^31)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value <= _INT32_MAX:
        raise ValueError(f"{name} must be an integer in int32, at least 0, got {value!r}")


def _check_options(growth_interval, hysteresis, min_scale, max_scale):
    """Refuse up front what ``update()`` could not use (its trackers are int32, the scale fp32),
    so that a bad value fails here and not in the middle of training. torch accepts any integer
    ``growth_interval`` (0 or less: the scale never grows), and so do we, within int32."""
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, numbers.Integral):
        raise TypeError(f"growth_interval must be an integer, got {growth_interval!r}")
    if not -_INT32_MAX - 1 <= growth_interval <= _INT32_MAX:
        raise ValueError(f"growth_interval must fit in int32, got {growth_interval}")
    if isinstance(hysteresis, bool) or not isinstance(hysteresis, numbers.Integral):
        raise TypeError(f"hysteresis must be an integer, got {hysteresis!r}")
    if not 1 <= hysteresis <= _INT32_MAX:
        raise ValueError(f"hysteresis must be at least 1 and fit in int32, got {hysteresis}")
    for name, bound in (("min_scale", min_scale), ("max_scale", max_scale)):
        if bound is None:
            continue
        if not isinstance(bound, numbers.Real):
            raise TypeError(f"{name} must be a number or None, got {bound!r}")
        if not _positive_in_fp32(bound):
            raise ValueError(f"{name} must be a positive, finite float32 value (or None), got {bound}")
    if min_scale is not None and max_scale is not None and min_scale > max_scale:
        raise ValueError(f"min_scale ({min_scale}) is larger than max_scale ({max_scale})")


def _check_loaded_torch_entries(state_dict):
    """The entries torch's GradScaler.load_state_dict reads, as its constructor would take them."""
    for key in ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"):
        if key not in state_dict:
            raise KeyError(f"GradScaler.load_state_dict: the state dict has no {key!r}")
    values = {}
    for key in ("scale", "growth_factor", "backoff_factor"):
        value = state_dict[key]
        if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"GradScaler.load_state_dict: {key} must be a finite number, got {value!r}")
        values[key] = value
    if not _positive_in_fp32(values["scale"]):
        raise ValueError(f"GradScaler.load_state_dict: scale must be positive and finite in "
                         f"float32, got {values['scale']}")
    if not values["growth_factor"] > 1.0:  # torch's constructor's checks
        raise ValueError(f"GradScaler.load_state_dict: growth_factor {values['growth_factor']}: "
                         "The growth factor must be > 1.0.")
    if not 0.0 < values["backoff_factor"] < 1.0:
        raise ValueError(f"GradScaler.load_state_dict: backoff_factor {values['backoff_factor']}: "
                         "The backoff factor must be < 1.0 (and positive).")
    _check_tracker("GradScaler.load_state_dict: _growth_tracker", state_dict["_growth_tracker"])


class GradScaler(torch.amp.GradScaler):
    r"""Loss scaling for mixed-precision training; the same API and behaviour as
    :class:`torch.amp.GradScaler`, with fused kernels and no host sync.

    Differences from torch, all additions:

    * ``unscale_`` accepts fp16 and bf16 grads (torch refuses fp16), in one fused pass.
    * ``found_inf`` handed to an optimizer is always 0.0 or 1.0, also when several devices
      overflow (torch sums them, and a fused kernel testing ``found_inf == 1`` then steps on
      inf grads).
    * With an optimizer that takes the scale into its step (``fused_amp.optim`` ones, and
      torch's ``fused=True`` optimizers) ``step`` never syncs with the host: the overflow check
      and the skip happen on the device, and ``optimizer.step()`` is always called.
    * ``hysteresis=N`` backs off only on the N-th overflow in a row; ``min_scale`` and
      ``max_scale`` bound the scale (a scale falling towards 0 on persistent NaN is a silent
      failure in torch: here it stops at ``min_scale`` and the scaler warns once).
    * ``track_overflows=True`` records which parameters held inf/NaN gradients;
      :meth:`overflow_report` tells them, by name for modules registered with :meth:`watch`.
    * ``skip_on_host=True`` decides on the host instead (one sync per step, as torch's scaler
      makes for optimizers that cannot skip on the device) and does not call
      ``optimizer.step()`` on an overflow step, for frameworks that tell a skipped step by that
      (accelerate and the HF Trainer, which then hold the LR scheduler):
      ``fused_amp.integrations.install_grad_scaler`` sets it.

    With any other ``torch.optim`` optimizer, deciding whether to step needs one host sync, as
    in torch.

    Args (as torch's): device, init_scale, growth_factor, backoff_factor, growth_interval,
    enabled. Keyword-only: hysteresis (default 1), min_scale, max_scale (default None: no
    bound), track_overflows (default False), skip_on_host (default False).
    """

    # inside step(): what its overflow check read, for the optimizer's step (else None; a class
    # attribute, so that scalers pickled before it existed load)
    _handed: Optional[List[Gathered]] = None

    def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True, *, hysteresis: int = 1,
                 min_scale: Optional[float] = None, max_scale: Optional[float] = None,
                 track_overflows: bool = False, skip_on_host: bool = False) -> None:
        _check_options(growth_interval, hysteresis, min_scale, max_scale)
        super().__init__(device, init_scale, growth_factor, backoff_factor, growth_interval, enabled)
        self._hysteresis = hysteresis
        self._hysteresis_tracker: Optional[torch.Tensor] = None
        self._init_hysteresis_tracker = 0
        self._min_scale = min_scale
        self._max_scale = max_scale
        self._at_min_scale = _HostFlag()
        self._warned_min_scale = False
        self._track_overflows = track_overflows
        self._skip_on_host = skip_on_host
        self._param_names: Dict[int, str] = {}
        self._skipped_steps: Optional[torch.Tensor] = None  # on the device: counted without a sync
        # id(optimizer) -> (params, per-param inf/NaN flags) of this iteration, and of the
        # latest iteration that was skipped
        self._overflow_flags: Dict[int, Any] = {}
        self._last_overflow: Dict[int, Any] = {}

    def scale(self, outputs):
        if self._enabled and in_backward.any_active():
            raise RuntimeError("GradScaler: a fused_amp.optim optimizer steps in backward (step_in_backward), with "
                               "the grads as backward leaves them: a scaled loss would step scaled grads, and the "
                               "scaler's skip of an overflowing step needs every grad before any param steps (handle.remove() "
                               "ends it)")
        if self._enabled:
            _scaling.scaled_a_loss(self)  # for a clip_grad_norm_ before the optimizer's first step
        return super().scale(outputs)

    # ---- the scale and its trackers ---------------------------------------------------------
    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        super()._lazy_init_scale_growth_tracker(dev)
        self._hysteresis_tracker = torch.full((), self._init_hysteresis_tracker, dtype=torch.int32,
                                              device=dev)

    # ---- unscaling and the overflow check ---------------------------------------------------
    @staticmethod
    def _grads_per_device(gathered):
        """The gathered grads to check, per device, and the process groups of the DTensors'
        meshes, across which the overflow flag must be combined."""
        params, grads = gathered.params, gathered.grads
        if not all(map(operator.is_not, grads, itertools.repeat(None))):
            params, grads = [p for p, g in zip(params, grads) if g is not None], [g for g in grads if g is not None]
        # FSDP2 and the like: the few distinct meshes of the grads' specs
        meshes = {id(spec.mesh): spec.mesh for spec in gathered.specs}.values()
        groups = list({id(pg): pg for mesh in meshes for pg in mesh.get_all_groups()}.values())
        if gathered.device is not None:  # the usual case: dense grads on one device
            return {gathered.device: grads}, groups
        per_device = defaultdict(list)
        for param, grad in zip(params, grads):
            if grad.is_sparse:
                # unscale the values of a coalesced sparse grad, as torch does
                if grad.dtype is torch.float16:
                    param.grad = grad = grad.coalesce()
                per_device[grad.device].append(grad._values())
            else:
                per_device[grad.device].append(grad)
        return per_device, groups

    def _gather(self, optimizer) -> Gathered:
        """The optimizer's grads, read once; inside ``step``, kept for the step (``_handed``)."""
        gathered = gather(optimizer)
        if self._handed is not None:
            self._handed.append(gathered)
        return gathered

    def _flags_per_device(self, optimizer, check) -> Dict[torch.device, torch.Tensor]:
        """Runs ``check(grads, found_inf)`` per device; with DTensor grads the flags are then
        combined with a MAX all-reduce over their meshes (as torch's sharding strategy for its
        unscale op does), so every rank skips or steps together. On the device with NCCL; on
        gloo/CPU the all-reduce is a wait, inherent to it."""
        per_device_found_inf = {}
        gathered = self._gather(optimizer)  # (its refs kept until the check has run)
        grads_per_device, groups = self._grads_per_device(gathered)
        with torch.no_grad():
            for device, grads in grads_per_device.items():
                found = torch.zeros((), dtype=torch.float32, device=device)
                check(grads, found)
                for group in groups + stage_groups(optimizer):  # the meshes, then the pipeline stages
                    torch.distributed.all_reduce(found, op=torch.distributed.ReduceOp.MAX, group=group)
                per_device_found_inf[device] = found
        self._record_overflow_params(optimizer)
        return per_device_found_inf

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        # allow_fp16 is ignored: fp16 grads are what half-precision training produces.
        return self._flags_per_device(
            optimizer, lambda grads, found: ops.unscale_(grads, found, inv_scale.to(found.device)))

    def _check_inf_per_device(self, optimizer):
        """The overflow check that precedes a step taking ``grad_scale``: reads the grads only."""
        self._check_scale_growth_tracker("_check_inf_per_device")
        per_device_found_inf = self._flags_per_device(optimizer, ops.non_finite_check_)
        self._per_optimizer_states[id(optimizer)]["found_inf_per_device"] = per_device_found_inf
        return per_device_found_inf

    def _grad_norm_pass(self, optimizer, norm_type) -> torch.Tensor:
        """The total norm of ``optimizer``'s unscaled grads, for clipping. While its grads are
        still scaled, the same read-only pass is the overflow check of the coming step."""
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if not self._enabled or optimizer_state["stage"] is not OptState.READY:
            return total_grad_norm(optimizer, norm_type, None)[0]  # unscaled already
        self._check_scale_growth_tracker("clip_grad_norm_")
        norm, found_infs = total_grad_norm(optimizer, norm_type, _scaling.inv_scale(self._scale),
                                           self._gather(optimizer))
        optimizer_state["found_inf_per_device"] = found_infs
        self._record_overflow_params(optimizer)
        return norm

    def _combined_found_inf(self, found_infs, device) -> torch.Tensor:
        """1.0 if any device overflowed, else 0.0; never a count."""
        found_infs = [f.to(device, non_blocking=True) for f in found_infs]
        combined = found_infs[0]
        for f in found_infs[1:]:
            combined = torch.maximum(combined, f)
        return combined

    # ---- step -------------------------------------------------------------------------------
    @staticmethod
    def _scaled_step_target(optimizer):
        """The optimizer that takes ``grad_scale`` and ``found_inf`` into its step: the optimizer
        itself, or the local optimizer of a torch ``ZeroRedundancyOptimizer`` (which does not
        say so itself); None for any other optimizer."""
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            return optimizer
        local = getattr(optimizer, "optim", None)
        if (_ZeroRedundancyOptimizer is not None and isinstance(optimizer, _ZeroRedundancyOptimizer)
                and getattr(local, "_step_supports_amp_scaling", False)):
            return local
        return None

    # torch.compile runs the scaler's step and update eagerly (as it breaks the graph in torch's
    # own GradScaler): Dynamo does not follow the grad_scale/found_inf attributes a step sets on
    # an optimizer inside a compiled region, and would step through an overflow.
    @torch.compiler.disable
    def step(self, optimizer, *args, **kwargs):
        target = self._scaled_step_target(optimizer) if self._enabled else None
        if target is None:
            return super().step(optimizer, *args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        if self._scale is None and stage_groups(optimizer):
            # a pipeline stage before the last never scales a loss: its grads arrive scaled by the
            # last stage's scaler, whose scale this one's follows step by step (same start, same
            # flags); the scale starts where scale() would start it
            self._lazy_init_scale_growth_tracker(next(p.device for g in optimizer.param_groups for p in g["params"]))
        self._check_scale_growth_tracker("step")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if "grad_scaler" in inspect.signature(optimizer.step).parameters:
            # torch's older protocol, deprecated: the optimizer asks the scaler itself
            warnings.warn(
                "GradScaler is going to stop passing itself as a keyword argument to the passed "
                "optimizer. In the near future GradScaler registers `grad_scale: Tensor` and "
                "`found_inf: Tensor` to the passed optimizer and let the optimizer use them directly.",
                FutureWarning, stacklevel=2)
            retval = optimizer.step(*args, **dict(kwargs, grad_scaler=self))
            optimizer_state["stage"] = OptState.STEPPED
            return retval
        if target is not optimizer and getattr(target, "max_grad_norm", None) is not None:
            raise NotImplementedError(
                "max_grad_norm on the local optimizer of a ZeroRedundancyOptimizer would clip by the "
                "norm of this rank's shard only; clip with torch.nn.utils.clip_grad_norm_ over the "
                "model's parameters (after scaler.unscale_) instead")
        # The step takes the scale and the overflow flag and skips on the device: no sync.
        _scaling.stepped(target, self)
        ours = isinstance(target, MasterWeightOptimizer)  # (its clip's norm pass may be the overflow check)
        handed = None
        if optimizer_state["stage"] is OptState.READY and not optimizer_state["found_inf_per_device"]:
            self._handed = []
            try:
                # a norm pass for clipping (ours) doubles as the overflow check
                if target is not optimizer or not ours or not target._clip.before_step(target, self):
                    self._check_inf_per_device(optimizer)
                handed = self._handed
            finally:
                self._handed = None
        scale = self._get_scale_async()
        found_infs = list(optimizer_state["found_inf_per_device"].values())
        found_inf = (self._combined_found_inf(found_infs, scale.device) if found_infs
                     else torch.zeros((), dtype=torch.float32, device=scale.device))
        # the overflow check read every grad of the optimizer's groups (with ZeRO: all params, whose
        # grads DDP made identical on every rank), so every rank gets the same flag without a collective
        target.grad_scale = (getattr(target, "grad_scale", None)
                             if optimizer_state["stage"] is OptState.UNSCALED
                             else scale * getattr(target, "grad_scale", 1))
        target.found_inf = found_inf
        # the grads the check just read are the step's, unless a pre-hook runs in between (it
        # may replace them): the optimizer takes them instead of reading every .grad again
        if (handed and len(handed) == 1 and target is optimizer and ours
                and not target._optimizer_step_pre_hooks and not _global_optimizer_pre_hooks):
            target._attached.scaler_grads = handed[0]
        try:
            if self._skip_on_host and found_inf.item() != 0:  # the one host sync of this mode
                retval = None
                if ours:
                    target._clip.pending = None  # a clip belongs to the step it was taken for
            else:
                retval = optimizer.step(*args, **kwargs)
        finally:
            del target.grad_scale
            del target.found_inf
            if ours:
                target._attached.scaler_grads = None
        optimizer_state["stage"] = OptState.STEPPED
        return retval

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        # an optimizer that cannot skip on the device: one host sync decides, as in torch
        if not any(v.item() for v in optimizer_state["found_inf_per_device"].values()):
            return optimizer.step(*args, **kwargs)
        return None

    # ---- update -----------------------------------------------------------------------------
    @torch.compiler.disable
    def update(self, new_scale=None) -> None:
        if not self._enabled:
            return
        if new_scale is not None:
            super().update(new_scale)
            return
        _scale, _growth_tracker = self._check_scale_growth_tracker("update")
        found_infs = [f for state in self._per_optimizer_states.values()
                      for f in state["found_inf_per_device"].values()]
        if len(found_infs) == 0:
            raise AssertionError("No inf checks were recorded prior to update.")
        found_inf = self._combined_found_inf(found_infs, _scale.device)
        ops.update_scale_(_scale, _growth_tracker, found_inf, self._growth_factor,
                          self._backoff_factor, self._growth_interval, hysteresis=self._hysteresis,
                          hysteresis_tracker=self._hysteresis_tracker, min_scale=self._min_scale,
                          max_scale=self._max_scale)
        if self._track_overflows:
            self._count_skipped(found_inf)
        if self._min_scale is not None:
            self._warn_at_min_scale(_scale)
        self._per_optimizer_states = defaultdict(torch.amp.grad_scaler._refresh_per_optimizer_state)

    def _warn_at_min_scale(self, scale):
        # reads the flag recorded at an earlier update, once its copy has landed: no sync
        if not self._warned_min_scale and self._at_min_scale.ready_value():
            self._warned_min_scale = True
            warnings.warn(f"GradScaler: the loss scale has fallen to min_scale={self._min_scale}; "
                          "gradients keep overflowing (inf/NaN in the loss or the model?)",
                          stacklevel=3)
        self._at_min_scale.record(scale <= self._min_scale)

    # ---- overflow diagnostics ---------------------------------------------------------------
    def watch(self, module: torch.nn.Module) -> None:
        """Name the parameters of ``module`` in :meth:`overflow_report`."""
        for name, p in module.named_parameters():
            self._param_names[id(p)] = name

    def _record_overflow_params(self, optimizer):
        if not self._track_overflows:
            return
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return
        grads = [p.grad._values() if p.grad.is_sparse else p.grad for p in params]
        flags = torch.stack([~torch.isfinite(g).all().to(params[0].device) for g in grads])
        self._overflow_flags[id(optimizer)] = (params, flags)

    def _count_skipped(self, found_inf):
        if self._skipped_steps is None:
            self._skipped_steps = torch.zeros((), dtype=torch.int64, device=found_inf.device)
        skipped = found_inf != 0
        self._skipped_steps += skipped
        for key, (params, flags) in self._overflow_flags.items():
            previous = self._last_overflow.get(key, (None, torch.zeros_like(flags)))[1]
            if previous.shape != flags.shape:  # the params with grads changed
                previous = torch.zeros_like(flags)
            self._last_overflow[key] = (params, torch.where(skipped.to(flags.device), flags, previous))
        self._overflow_flags = {}

    def overflow_report(self) -> OverflowReport:
        """Skipped steps so far, and which parameters overflowed last (``track_overflows=True``).
        Reads device tensors: call it when a sync is acceptable (e.g. for logging)."""
        if not self._track_overflows:
            raise RuntimeError("overflow_report() needs GradScaler(..., track_overflows=True)")
        if self._skipped_steps is None:
            return OverflowReport(0, [])
        names = []
        for params, flags in self._last_overflow.values():
            for i in flags.nonzero().flatten().tolist():
                names.append(self._param_names.get(id(params[i]), f"param[{i}]"))
        return OverflowReport(int(self._skipped_steps.item()), names)

    # ---- state --------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """torch's entries, plus ``hysteresis``, ``_hysteresis_tracker``, ``min_scale`` and
        ``max_scale``, which torch's ``load_state_dict`` ignores."""
        state = super().state_dict()
        if self._enabled:
            state.update(hysteresis=self._hysteresis, min_scale=self._min_scale,
                         max_scale=self._max_scale, _hysteresis_tracker=(
                             self._init_hysteresis_tracker if self._hysteresis_tracker is None
                             else int(self._hysteresis_tracker.item())))
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """torch's loading, with every entry checked before anything is loaded: a state dict
        torch would load and then scale or update wrongly with (a NaN, infinite, zero or
        negative scale; factors that do not grow or back off; a negative tracker; a missing
        key, which torch notices after loading some) raises, naming the key."""
        if self._enabled and state_dict:  # checked before anything is loaded
            _check_loaded_torch_entries(state_dict)
            _check_options(state_dict.get("growth_interval", self._growth_interval),
                           state_dict.get("hysteresis", self._hysteresis),
                           state_dict.get("min_scale", self._min_scale),
                           state_dict.get("max_scale", self._max_scale))
            _check_tracker("_hysteresis_tracker", state_dict.get("_hysteresis_tracker", 0))
        super().load_state_dict(state_dict)
        if not self._enabled:
            return
        self._hysteresis = state_dict.get("hysteresis", self._hysteresis)
        self._min_scale = state_dict.get("min_scale", self._min_scale)
        self._max_scale = state_dict.get("max_scale", self._max_scale)
        self._init_hysteresis_tracker = state_dict.get("_hysteresis_tracker", 0)
        if self._hysteresis_tracker is not None:
            self._hysteresis_tracker.fill_(self._init_hysteresis_tracker)

    def __getstate__(self) -> Dict[str, Any]:
        state = super().__getstate__()
        state["_at_min_scale"] = _HostFlag()  # holds a CUDA event, which does not pickle
        if self._enabled and self._hysteresis_tracker is not None:
            # as torch keeps the growth tracker's progress: a value, the tensor made anew
            state["_init_hysteresis_tracker"] = int(self._hysteresis_tracker.item())
            state["_hysteresis_tracker"] = None
        return state
