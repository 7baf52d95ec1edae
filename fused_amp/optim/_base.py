"""The base of every optimizer of fused_amp.optim: its groups and their checks, and the step,
one fused op per group and device. Its other concerns are mixins of their own files: what each
optimizer declares (_declared), the tensor lists (_group_lists), clipping (_clipping) and
checkpoints (_state_dict)."""
from typing import Any, Dict, Optional

import torch

from fused_amp import _scaling, ops
from fused_amp.optim import _float8, _float8_copies, _memory, _quantize
from fused_amp.optim._attached import Attached
from fused_amp.optim._clipping import ClipGradNorm, ClipState
from fused_amp.optim._declared import Declared
from fused_amp.optim._grad_norm import check_clip_options, check_same_clip_options
from fused_amp.optim._group_lists import DeviceLists, GroupLists
from fused_amp.optim._state_dict import TorchStateDict

_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)


class MasterWeightOptimizer(Declared, DeviceLists, ClipGradNorm, TorchStateDict, torch.optim.Optimizer):
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
                                       "rounding_seed": 0, "min_8bit_size": _quantize.MIN_8BIT_SIZE,
                                       "float8_scales": None}

    def __init__(self, params, defaults):
        """``defaults``: every constructor argument but ``params`` (``_options.group_options``), the
        clip options among them: torch keeps every option in the groups, so checkpoints carry them.
        They are checked as torch checks them, then kept as torch keeps them."""
        self._check_hyperparameters(defaults)
        defaults = self._kept_options(defaults)
        check_clip_options(defaults["max_grad_norm"], defaults["grad_norm_type"])
        self._lists_cache: Dict[int, GroupLists] = {}  # by the group's index in param_groups
        self._clip = ClipState()
        self._attached = Attached()
        super().__init__(params, dict(defaults, grad_norm_type=float(defaults["grad_norm_type"])))

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
        if group["float8_scales"] not in (None, True, False):
            raise ValueError(f"{name}: float8_scales must be True, False or None, got {group['float8_scales']!r}")
        check_clip_options(group["max_grad_norm"], group["grad_norm_type"])
        group["grad_norm_type"] = float(group["grad_norm_type"])
        check_same_clip_options(name, self.param_groups[:index] + [group])

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
        if self._attached.in_backward is not None:  # the params stepped in backward (in_backward.py)
            return loss
        self._fused_step()
        return loss

    @torch.no_grad()
    def _step_params(self, params) -> None:
        """One step of ``params`` only (those of them with grads), as :meth:`step` steps them:
        step_in_backward's, for the params whose grads have arrived."""
        self._attached.only = set(params)
        try:
            self._fused_step()
        finally:
            self._attached.only = None

    @torch.no_grad()
    def _hand_over_after_backward(self) -> None:
        """When a backward that stepped its params in buckets (step_in_backward) ends: the
        torchao float8 scales of all the weights it stepped, in one hand-over (one all-reduce),
        as after a whole step. (Each weight is in one bucket's lists, with the amax its step wrote.)"""
        stepped, self._attached.float8_stepped = self._attached.float8_stepped, []
        if stepped:
            _float8.hand_over(stepped)

    def _fused_step(self) -> None:
        if getattr(self, "found_inf", None) is None and not torch.compiler.is_compiling():
            _scaling.stepped(self)  # without a GradScaler (host bookkeeping, left out when traced)
        clip = self._clip_of_step(self._inv_scale())
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
            whole = self._attached.only is None  # (not a bucket of params in backward)
            if whole:
                _float8.check_asked(type(self).__name__, self.param_groups, [lists for _, lists, _ in calls])
            if len(calls) > 1:
                for group, lists, scalars in calls:
                    self._update(group, lists, scalars, check_only=True)
            for group, lists, scalars in calls:
                self._update(group, lists, scalars, check_only=False)
            if whole:
                _float8.hand_over([lists for _, lists, _ in calls])
            else:  # a bucket in backward: every weight's scale is handed over when backward ends, at once
                self._attached.float8_stepped.extend(
                    lists for _, lists, _ in calls if "float8_wrappers" in lists)
            _float8_copies.after_step(self, [lists for _, lists, _ in calls])
        finally:
            # the grads are this step's: the cached lists keep them no longer, so that zero_grad()
            # frees them as it does with torch's optimizers
            for _, lists, _ in calls:
                lists["grads"], lists["grad_refs"] = [], None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's; does nothing while the params step in backward (their grads are freed there)."""
        if self._attached.in_backward is not None:
            return
        self._clip.pending = None
        super().zero_grad(set_to_none)

    def _update(self, group, lists, scalars, check_only):
        """Run (or with ``check_only`` validate) the fused op on one device's lists; ``scalars``
        holds lr, lr_tensor, inv_scale, found_inf, unscale_grads and, when clipping, grad_norm and
        max_grad_norm. The op's list parts are formed once per lists and kept with them (a step
        of a small tensor costs what its host side costs: torchao's offload engine steps one
        param at a time); the op checks every argument before it writes."""
        parts = lists.get("op_parts")
        if parts is None:
            parts = _op_parts(lists, self._kept_keys(self._hyper(group)), self._scalar_state)
            if not torch.compiler.is_compiling():  # (a traced step keeps nothing: _device_lists)
                lists["op_parts"] = parts
        if check_only and torch.compiler.is_compiling():  # (the fake kernels of the traced calls check them)
            return
        hyper = self._hyper(group)
        seed = scalars.get("rounding_seed")
        ops.call_step(check_only, self._kernel, parts["params"], lists["grads"], parts["master_params"],
                      parts["states"], lists["steps"] if self._counts_steps(group, scalars) else [],
                      parts["state_absmaxes"], parts["scalar_states"], [], parts["epilogues"],
                      parts["epilogue_layout"],
                      [float(hyper[name]) for name in self._hyper_names]
                      + [float(scalars["lr"]), float(scalars.get("max_grad_norm") or 0.0)],
                      [scalars.get(key) for key in ("lr_tensor", "inv_scale", "found_inf", "grad_norm")],
                      [] if seed is None else [int(seed), int(scalars.get("stochastic_codes", False))],
                      bool(scalars.get("unscale_grads", True)))


def _op_parts(lists, keys, scalar_state) -> Dict[str, list]:
    """The step op's parts that stay the same while ``lists`` do (ops.step_ names them): the
    states of ``keys`` in one list, the epilogues (fp8 scaling and copies) in the op's form."""
    epilogues, layout = ops.epilogue_parts("step_", {key: lists.get(key) for key in ops.EPILOGUES})
    return {"params": lists["params"], "master_params": lists["master_params"],
            "states": [t for key in keys for t in lists[key]],
            "state_absmaxes": lists["state_absmaxes"] if keys else [],
            "scalar_states": lists[scalar_state[0]] if scalar_state else [],
            "epilogues": epilogues, "epilogue_layout": layout}
