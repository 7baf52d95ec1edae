"""The base of every optimizer of fused_amp.optim: torch.optim.Optimizer's face, and the step,
one fused op per group and device. The parts it is made of are in files of their own, each
called with the optimizer or held by it: what the C++ table declares of each optimizer class
(_declared), the tensor lists (_group_lists, ``_lists``), clipping (_clipping, ``_clip``),
checkpoints (_state_dict), what the rest of fused_amp attaches (_attached, ``_attached``) and the
steady state's repeated call (_replay, ``_replay``)."""
from typing import Any, Dict, Optional

import torch

from fused_amp import _scaling, ops
from fused_amp.optim import _declared, _float8, _float8_copies, _memory, _quantize, _state_dict
from fused_amp.optim._attached import Attached
from fused_amp.optim._clipping import Clipping, clip_option, set_clip_option
from fused_amp.optim._grad_norm import check_clip_options, check_same_clip_options
from fused_amp.optim._group_lists import ListCache
from fused_amp.optim._options import check_in_order, check_torch_flags
from fused_amp.optim._replay import Replay, lr_parts

_SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)


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
                                       "rounding_seed": 0, "min_8bit_size": _quantize.MIN_8BIT_SIZE,
                                       "float8_scales": None}

    # ---- what a subclass declares ---------------------------------------------------------
    # the optimizer's name in the step op's table (fused_amp.ops.optimizers()): by default the
    # class's name in lower case, or its base's (AdamW: "adam"), set by _declared.declare
    _kernel = ""
    # its per-param scalar state, as (key, initial value) (NAdam's mu_product), or None: the table's
    _scalar_state = None
    # the names of its hyperparameters, in the order the step op takes them: the table's
    _hyper_names: tuple = ()
    # what the docs of fused_amp's options (_options.options_doc) add for this optimizer: option
    # -> a sentence
    _option_notes: dict = {}
    # whether its state is a running sum, which rounds stochastically by default when stored in
    # bf16 or 8 bits (rounded to nearest, increments below half a step would be lost)
    _running_sums = False
    # whether torch's checkpoints of this optimizer hold a step count beside the moments
    _step_count_saved = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _declared.declare(cls)

    def _hyper(self, group) -> dict:
        """The step op's hyperparameters of a group, by the names of its table entry."""
        raise NotImplementedError

    # the arguments torch checks with its shared checks (_options.check_in_order), in its order;
    # then its flags. A subclass whose torch optimizer checks more overrides _check_hyperparameters
    _checked_in_order: tuple = ()

    @classmethod
    def _check_hyperparameters(cls, options):
        """torch's checks of the optimizer's arguments, with its messages and in its order, on a
        dict of them: the constructor's, or a loaded group's."""
        check_in_order(options, *cls._checked_in_order)
        check_torch_flags(cls.__name__, options["foreach"], options.get("fused"), options["differentiable"])

    @staticmethod
    def _kept_options(options) -> dict:
        """The constructor's checked options as torch keeps them in ``defaults`` (Adam: the first
        two betas, a 1-element tensor as a 0-dim one)."""
        return options

    def _counts_steps(self, group, scalars) -> bool:
        """Whether the step counts go to the op (they always advance in the state)."""
        return True

    def _initial_state(self, group) -> dict:
        """The value each state starts from, by key, where it is not zero."""
        return {}

    def _plan_lists(self, lists) -> None:
        """Called on each device's lists when they are built; a subclass adds to them what
        depends on the params alone, kept with the lists while they stay cached."""

    def _complete_loaded_state(self, p, state):
        """Adapt the state of a ``torch.optim`` checkpoint (subclasses add what it lacks)."""
        step = state.get("step")
        if step is not None and not isinstance(step, torch.Tensor):  # a legacy Python number
            state["step"] = torch.tensor(float(step), dtype=torch.float32, device=p.device)

    def _fix_group(self, group):
        """Group options a subclass forces whatever the checkpoint says (AdamW: decoupled)."""

    def _state_keys_for(self, group) -> tuple:
        """The state tensors shaped like the param, zero-filled when a param first steps: those
        its step op keeps with the group's hyperparameters (the C++ descriptor says which)."""
        return self._kept_keys(self._hyper(group))

    def _kept_keys(self, hyper) -> tuple:
        """The state keys the step op keeps with these hyperparameters (``_hyper``'s dict)."""
        return tuple(key for key, _ in ops.kept_states(self._kernel, hyper))

    # ---- construction ---------------------------------------------------------------------
    def __init__(self, params, defaults):
        """``defaults``: every constructor argument but ``params`` (``_options.group_options``), the
        clip options among them: torch keeps every option in the groups, so checkpoints carry them.
        They are checked as torch checks them, then kept as torch keeps them."""
        self._check_hyperparameters(defaults)
        defaults = self._kept_options(defaults)
        check_clip_options(defaults["max_grad_norm"], defaults["grad_norm_type"])
        self._init_parts()
        super().__init__(params, dict(defaults, grad_norm_type=float(defaults["grad_norm_type"])))

    def _init_parts(self):
        """The parts the optimizer holds (not pickled: torch pickles its defaults, state and
        groups only, and ``__setstate__`` makes them anew)."""
        self._lists = ListCache()
        self._clip = Clipping()
        self._attached = Attached()
        self._replay: Optional[Replay] = None  # the last step's op call, while it may be made again

    def __setstate__(self, state):
        super().__setstate__(state)
        self._init_parts()
        _state_dict.fill_options(self)

    def add_param_group(self, param_group):
        self._lists.forget()
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

    @staticmethod
    def _on_device(inv_scale, found_inf, device):
        """(inv_scale, found_inf) of a step (from what a GradScaler set, or None) on ``device``."""
        if inv_scale is not None:
            inv_scale = inv_scale.to(device, non_blocking=True)
        if found_inf is not None:
            found_inf = found_inf.to(device, dtype=torch.float32, non_blocking=True)
        return inv_scale, found_inf

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
        # under no_grad, as torch.no_grad() would set it, for a quarter of its cost (its
        # context manager's Python costs ~2 us, an eighth of a small tensor's step)
        enabled = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            self._fused_step()
        finally:
            torch._C._set_grad_enabled(enabled)
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
        if self._replay is not None and self._replay.run(self):  # (the steady state: _replay.py)
            return
        self._replay = None
        found_inf: Optional[torch.Tensor] = getattr(self, "found_inf", None)
        if found_inf is None and not torch.compiler.is_compiling():
            _scaling.stepped(self)  # without a GradScaler (host bookkeeping, left out when traced)
        inv_scale = self._inv_scale()
        clip = self._clip.of_step(self, inv_scale)
        self._lists.drop_removed(len(self.param_groups))
        calls = []
        for index, group in enumerate(self.param_groups):
            hyper = self._lists.hyper(self, index, group)  # (the lists and the op take it)
            for device, lists in self._lists.lists(self, index, group, hyper).items():
                inv_scale_on, found_inf_on = self._on_device(inv_scale, found_inf, device)
                lr, lr_tensor = lr_parts(group["lr"])
                scalars = dict(hyper=hyper, lr=lr, lr_tensor=lr_tensor,
                               inv_scale=inv_scale_on, found_inf=found_inf_on,
                               unscale_grads=group["unscale_grads"],
                               rounding_seed=_memory.rounding_seed_of(group, self._running_sums),
                               stochastic_codes=_memory.stochastic_codes(group, self._running_sums))
                if clip is not None:
                    scalars.update(grad_norm=clip[0].to(device, non_blocking=True),
                                   max_grad_norm=clip[1])
                calls.append((group, lists, scalars))
        # Each op checks its arguments before it writes; with several ops (groups, devices),
        # all are checked before the first runs, so a bad grad anywhere changes nothing.
        all_lists = [lists for _, lists, _ in calls]
        try:
            whole = self._attached.only is None  # (not a bucket of params in backward)
            if whole:
                _float8.check_asked(type(self).__name__, self.param_groups, all_lists)
            if len(calls) > 1:
                for group, lists, scalars in calls:
                    self._update(group, lists, scalars, check_only=True)
            for group, lists, scalars in calls:
                self._update(group, lists, scalars, check_only=False)
            if whole:
                _float8.hand_over(all_lists)
            else:  # a bucket in backward: every weight's scale is handed over when backward ends, at once
                self._attached.float8_stepped.extend(lists for lists in all_lists if "float8_wrappers" in lists)
            _float8_copies.after_step(self, all_lists)
            if type(self)._update is MasterWeightOptimizer._update:  # (Muon steps in passes of its own)
                self._replay = Replay.of(self, calls, clip, inv_scale, found_inf)
        finally:
            # the grads are this step's: the cached lists keep them no longer, so that zero_grad()
            # frees them as it does with torch's optimizers
            for lists in all_lists:
                lists["grads"], lists["grad_refs"] = [], None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's; does nothing while the params step in backward (their grads are freed there)."""
        if self._attached.in_backward is not None:
            return
        self._clip.pending = None
        super().zero_grad(set_to_none)

    # ---- the state and the lists the step takes -------------------------------------------
    def _init_state(self, p, group, moments):
        """Create what a param's step needs (``moments``, the group's ``_state_keys_for``, in its
        state dtype), and bring a master that a checkpoint or a change of ``master_weights`` left
        in another form (fp32, remainder, 24-bit) to the group's."""
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
        _memory.bring_state(type(self).__name__, p, group, state, moments, self._initial_state(group))
        _memory.bring_master(p, group, state)
        return state

    # ---- clipping (_clipping) -------------------------------------------------------------
    @property
    def max_grad_norm(self) -> Optional[float]:
        """The total norm the grads are clipped to at every step (None: no clipping), kept in
        every param group (and so in checkpoints); setting it sets it in all groups."""
        return clip_option(self, "max_grad_norm")

    @max_grad_norm.setter
    def max_grad_norm(self, value):
        set_clip_option(self, "max_grad_norm", value)

    @property
    def grad_norm_type(self) -> float:
        """The norm of ``max_grad_norm`` (2.0, 1.0 or inf), a group option as ``max_grad_norm``."""
        return clip_option(self, "grad_norm_type")

    @grad_norm_type.setter
    def grad_norm_type(self, value):
        set_clip_option(self, "grad_norm_type", value)

    @property
    def last_grad_norm(self) -> Optional[torch.Tensor]:
        """The pre-clip total norm of the unscaled grads at the latest clipped step (0-dim fp32
        tensor on the params' device), for logging; None before any."""
        return self._clip.last_norm

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
        return self._clip.take(self, max_norm, norm_type, error_if_nonfinite)

    # ---- checkpoints (_state_dict) --------------------------------------------------------
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
        return _state_dict.state_dict_of(self, compact, super().state_dict)

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
        _state_dict.load_into(self, state_dict, super().load_state_dict)

    def _update(self, group, lists, scalars, check_only):
        """Run (or with ``check_only`` validate) the fused op on one device's lists; ``scalars``
        holds the group's ``hyper`` (``_group_lists.Hyper``), lr, lr_tensor, inv_scale, found_inf,
        unscale_grads and, when clipping, grad_norm and max_grad_norm. The op's list parts, and
        the hyperparameters as it takes them, are formed once and kept while they hold (a step
        of a small tensor costs what its host side costs: torchao's offload engine steps one
        param at a time); the op checks every argument before it writes."""
        hyper = scalars["hyper"]
        parts = lists.get("op_parts")
        if parts is None:
            parts = _op_parts(lists, hyper.moments, self._scalar_state)
            if not torch.compiler.is_compiling():  # (a traced step keeps nothing: ListCache.lists)
                lists["op_parts"] = parts
        if check_only and torch.compiler.is_compiling():  # (the fake kernels of the traced calls check them)
            return
        seed = scalars.get("rounding_seed")
        call = (self._kernel, parts["params"], lists["grads"], parts["master_params"],
                parts["states"], lists["steps"] if self._counts_steps(group, scalars) else [],
                parts["state_absmaxes"], parts["scalar_states"], [], parts["epilogues"],
                parts["epilogue_layout"],
                hyper.values + [float(scalars["lr"]), float(scalars.get("max_grad_norm") or 0.0)],
                [scalars.get(key) for key in ("lr_tensor", "inv_scale", "found_inf", "grad_norm")],
                [] if seed is None else [int(seed), int(scalars.get("stochastic_codes", False))],
                bool(scalars.get("unscale_grads", True)))
        ops.call_step(check_only, *call)
        if not check_only:  # what a Replay makes again with its grads and lr: no tensor of this step
            parts["call"] = call[:2] + ([],) + call[3:12] + ([None] * 4,) + call[13:]


def _op_parts(lists, keys, scalar_state) -> Dict[str, list]:
    """The step op's parts that stay the same while ``lists`` do (ops.step_ names them): the
    states of ``keys`` in one list, the epilogues (fp8 scaling and copies) in the op's form."""
    epilogues, layout = ops.epilogue_parts("step_", {key: lists.get(key) for key in ops.EPILOGUES})
    return {"params": lists["params"], "master_params": lists["master_params"],
            "states": [t for key in keys for t in lists[key]],
            "state_absmaxes": lists["state_absmaxes"] if keys else [],
            "scalar_states": lists[scalar_state[0]] if scalar_state else [],
            "epilogues": epilogues, "epilogue_layout": layout}
