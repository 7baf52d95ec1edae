"""fused_amp in torchtitan's trainer: its optimizers by name in torchtitan's optimizer container,
with their options in torchtitan's config, and torchtitan's gradient clip done inside the step.

The way in is one call in the user's config function (docs/torchtitan.md)::

    from torchtitan.models.llama3.config_registry import llama3_debugmodel
    from fused_amp.integrations.torchtitan import use_fused_amp

    def llama3_fused_amp():
        return use_fused_amp(llama3_debugmodel(), master_weights="remainder")

run as ``torchrun ... -m torchtitan.train --module my_configs --config llama3_fused_amp``.

torchtitan 0.3.0 has no optimizer registry and always clips in its trainer
(``Trainer.train_step`` calls ``torchtitan.distributed.utils.clip_grad_norm_``). So the config
``use_fused_amp`` returns builds two subclasses: :class:`FusedAmpOptimizersContainer`, whose
optimizers are fused_amp's, and :class:`FusedAmpTrainer`, whose ``train_step`` is torchtitan's
with that one call routed to the container: the norm is taken over every optimizer the container
holds (the model chunks of an interleaved pipeline schedule, Muon and AdamW), every mesh dim and
every pipeline stage, without a host sync, and the optimizers' step applies the clip. The route is
by name, so this module refuses a torchtitan release it was not written against.
"""
import dataclasses
import types
import warnings
from typing import Any, Callable, Literal, Optional

import torch

import fused_amp.optim

try:
    import torchtitan
    import torchtitan.trainer as _trainer_module
    from torchtitan.components.optimizer import OptimizersContainer
    from torchtitan.components.optimizer.utils import init_optim_state
    from torchtitan.trainer import Trainer
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("fused_amp.integrations.torchtitan needs torchtitan (pip install torchtitan==0.3.0)") from e

__all__ = ["FusedAmpOptimizersContainer", "FusedAmpTrainer", "use_fused_amp", "KNOWN_TORCHTITAN"]

# The releases whose trainer this module routes into (its train_step's clip call, its
# container's param groups): another release is refused rather than silently trained by torch.
KNOWN_TORCHTITAN = ("0.3.0",)


def _check_version(version: str = torchtitan.__version__) -> None:
    if version.split("+")[0] not in KNOWN_TORCHTITAN:
        raise RuntimeError(
            f"fused_amp.integrations.torchtitan: torchtitan {version} is not a release it knows "
            f"({', '.join(KNOWN_TORCHTITAN)}): it replaces the clip call of torchtitan's "
            "Trainer.train_step and builds on its OptimizersContainer, which another release may "
            "change; install torchtitan==0.3.0 or a fused_amp that knows this release")


_check_version()

# torchtitan's config names what torch.optim names with dtypes (tyro parses strings, not dtypes)
_STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "uint8": torch.uint8}
_MASTER_WEIGHTS = {"fp32": True, "none": False, "remainder": "remainder", "remainder8": "remainder8"}
# the optimizers a ParamGroupConfig may name: every class fused_amp.optim exports
_OPTIMIZERS = {name: getattr(fused_amp.optim, name) for name in fused_amp.optim.__all__
               if isinstance(getattr(fused_amp.optim, name), type)}


class FusedAmpOptimizersContainer(OptimizersContainer):
    """torchtitan's ``OptimizersContainer`` with fused_amp's optimizers: each
    ``ParamGroupConfig.optimizer_name`` names a class of :mod:`fused_amp.optim` ("AdamW",
    "Muon", ...), and the options below go into every param group (a group's
    ``optimizer_kwargs`` may override them, in fused_amp's own spelling).

    :meth:`clip_grad_norm_` clips every optimizer it holds by one norm; :class:`FusedAmpTrainer`
    routes torchtitan's clip there.
    """

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        master_weights: Literal["fp32", "remainder", "remainder8", "none"] = "fp32"
        """Masters of bf16/fp16 params: fp32 (4 bytes a param), "remainder" (the exact fp32
        master in 2 bytes), "remainder8" (24-bit masters in 1 byte) or "none" (bf16 in place).
        fp32 params need none."""

        state_dtype: Literal["float32", "bfloat16", "uint8"] = "float32"
        """The optimizer state's storage: fp32, bf16 or 8-bit blockwise codes."""

        stochastic_rounding: Optional[bool] = None
        """Round what is stored in fewer than 32 bits stochastically (default: fused_amp's)."""

        step_in_backward: bool = False
        """Step each param as its grad arrives and free the grad (needs
        ``training.max_norm=inf``, no pipeline stages and no gradient accumulation)."""

        fused_clip: bool = True
        """Clip by ``training.max_norm`` inside the step (one norm over every optimizer, mesh dim
        and stage). False leaves torchtitan's own ``clip_grad_norm_``, which rewrites the grads."""

    def __init__(self, config: Config, *, model_parts) -> None:
        if config.implementation == "fused_opt_states_bf16":
            raise ValueError("FusedAmpOptimizersContainer: implementation='fused_opt_states_bf16' is a hook for "
                             "torch's Adam; set state_dtype='bfloat16' instead")
        self.fused_clip = config.fused_clip
        super().__init__(config, model_parts=model_parts)
        self._in_backward = [fused_amp.optim.step_in_backward(o) for o in self.optimizers] \
            if config.step_in_backward else []
        clipping_alone = [type(o).__name__ for o in self.optimizers if o.max_grad_norm is not None]
        if clipping_alone and len(self.optimizers) > 1:
            warnings.warn(
                f"FusedAmpOptimizersContainer: {len(self.optimizers)} optimizers hold this model's params and "
                f"{', '.join(clipping_alone)} clip by their own norm (max_grad_norm): each part of the model is "
                "clipped differently from torch's one clip of the whole; leave max_grad_norm out and clip with "
                "training.max_norm", stacklevel=2)

    @staticmethod
    def _resolve_optimizer_factory(name: str) -> Callable[..., torch.optim.Optimizer]:
        if name not in _OPTIMIZERS:
            raise NotImplementedError(f"Optimizer {name} not added: fused_amp.optim has {', '.join(sorted(_OPTIMIZERS))}")
        return _OPTIMIZERS[name]

    @staticmethod
    def _build_impl_kwargs(config: Config) -> dict[str, Any]:
        options = OptimizersContainer._build_impl_kwargs(config)
        options.update(master_weights=_MASTER_WEIGHTS[config.master_weights],
                       state_dtype=_STATE_DTYPES[config.state_dtype],
                       stochastic_rounding=config.stochastic_rounding)
        return options

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torchtitan's flat, FQN-keyed state dict loaded into each optimizer. torchtitan's own
        load asks the checkpoint for the state each param holds now, by name; a fused_amp
        optimizer holds some of it in another form than its checkpoint does (a bf16 param's
        remainder, where ``state_dict()`` writes the fp32 ``master_param``; 8-bit codes and their
        absmax, where it writes fp32 moments), so that load would drop the masters. This one asks
        for what ``state_dict()`` writes."""
        for optimizer in self.optimizers:
            init_optim_state(optimizer)
            optimizer.load_state_dict(_from_flat(optimizer, state_dict))

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                        pp_mesh=None) -> torch.Tensor:
        """torchtitan's ``clip_grad_norm_(params, max_norm, pp_mesh=...)`` over the params of every
        optimizer held, done by their next step: :func:`fused_amp.optim.clip_grad_norm_` with each
        optimizer spanning the pipeline stages of ``pp_mesh``. Returns the total norm (before
        clipping), a 0-dim tensor computed without a host sync."""
        for optimizer in self.optimizers:
            fused_amp.optim.span_stages(optimizer, pp_mesh)
        return fused_amp.optim.clip_grad_norm_(self.optimizers, max_norm, norm_type, error_if_nonfinite)


def _from_flat(optimizer, flat: dict[str, Any]) -> dict[str, Any]:
    """The integer-keyed state dict of ``optimizer`` that torchtitan's flat one holds (keys
    ``state.{fqn}.{name}`` and ``param_groups.{fqn}.{option}``), with the state names and
    options that ``optimizer.state_dict()`` writes."""
    own = optimizer.state_dict()
    state, groups = {}, []
    for group in own["param_groups"]:
        names = group["param_names"]
        for index, fqn in zip(group["params"], names):
            entry = {name: flat[f"state.{fqn}.{name}"] for name in own["state"].get(index, {})
                     if f"state.{fqn}.{name}" in flat}
            if entry:
                state[index] = entry
        options = {"params": group["params"]}
        for key in group:
            if key in ("params", "param_names") or not names:
                continue
            flat_key = f"param_groups.{names[0]}.{key}"
            if flat_key not in flat:
                raise KeyError(f"Optimizer param group key {key!r} not found in checkpoint (looked up via param "
                               f"{names[0]!r})")
            options[key] = flat[flat_key]
        groups.append(options)
    return {"state": state, "param_groups": groups}


class FusedAmpTrainer(Trainer):
    """torchtitan's ``Trainer`` whose gradient clip runs inside fused_amp's step: ``train_step``
    is torchtitan's, with its call of ``torchtitan.distributed.utils.clip_grad_norm_`` answered by
    :meth:`FusedAmpOptimizersContainer.clip_grad_norm_` (``training.max_norm`` keeps its meaning,
    and the logged grad norm is the same total norm)."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        optimizer: FusedAmpOptimizersContainer.Config = dataclasses.field(
            default_factory=FusedAmpOptimizersContainer.Config)

    def __init__(self, config: Config):
        optimizer = config.optimizer
        if not isinstance(optimizer, FusedAmpOptimizersContainer.Config):
            raise TypeError(f"FusedAmpTrainer: config.optimizer is {type(optimizer).__qualname__}, not "
                            "FusedAmpOptimizersContainer.Config (use_fused_amp makes one)")
        super().__init__(config)
        if optimizer.step_in_backward:  # (before any step: the trainer's own layout and accumulation)
            _check_step_in_backward(config.training.max_norm, self.parallel_dims.pp_enabled,
                                    self.gradient_accumulation_steps)
        self._routed_dist_utils = _routed_dist_utils(self.optimizers)

    def train_step(self, data_iterator):
        if not self.optimizers.fused_clip:
            return super().train_step(data_iterator)
        real = _trainer_module.dist_utils
        _trainer_module.dist_utils = self._routed_dist_utils
        try:
            return super().train_step(data_iterator)
        finally:
            _trainer_module.dist_utils = real


def _check_step_in_backward(max_norm, pp_enabled: bool, accumulation_steps: int) -> None:
    reasons = []
    if max_norm != float("inf"):
        reasons.append(f"training.max_norm={max_norm} (clipping by the global norm needs every grad before any "
                       "param steps: set it to inf)")
    if pp_enabled:
        reasons.append("pipeline stages (each microbatch's backward would step)")
    if accumulation_steps > 1:
        reasons.append(f"{accumulation_steps} gradient accumulation steps (each backward would step)")
    if reasons:
        raise ValueError("FusedAmpOptimizersContainer: step_in_backward with " + "; ".join(reasons))


def _routed_dist_utils(container: FusedAmpOptimizersContainer) -> types.ModuleType:
    """torchtitan's ``torchtitan.distributed.utils`` as the trainer module sees it during
    ``FusedAmpTrainer.train_step``: its own, but for ``clip_grad_norm_``, the container's."""
    real = _trainer_module.dist_utils

    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None,
                        pp_mesh=None, ep_enabled=False):
        if ep_enabled:
            raise NotImplementedError("FusedAmpTrainer: expert parallelism's clip (separate norms of the expert "
                                      "and dense params) is not done in fused_amp's step; set fused_clip=False")
        if container._in_backward:  # the params stepped in backward; their grads are gone
            return torch.full((), float("nan"))
        return container.clip_grad_norm_(max_norm, norm_type, error_if_nonfinite, pp_mesh)

    routed = types.ModuleType(real.__name__)
    routed.__dict__.update(real.__dict__)
    routed.clip_grad_norm_ = clip_grad_norm_
    return routed


def use_fused_amp(config: Trainer.Config, **options) -> FusedAmpTrainer.Config:
    """``config`` (a torchtitan ``Trainer.Config``) as a :class:`FusedAmpTrainer` config whose
    optimizers are fused_amp's: the same fields, and the same optimizer param groups (their
    ``optimizer_name``\\ s name fused_amp classes), with ``options`` set on
    :class:`FusedAmpOptimizersContainer.Config` (``master_weights``, ``state_dtype``,
    ``stochastic_rounding``, ``step_in_backward``, ``fused_clip``, or any of torchtitan's)."""
    if not isinstance(config, Trainer.Config):
        raise TypeError(f"use_fused_amp: config must be a torchtitan Trainer.Config, got {type(config).__name__}")
    known = {f.name for f in dataclasses.fields(FusedAmpOptimizersContainer.Config)}
    # (a config use_fused_amp made already keeps its options, unless given again)
    optimizer = {f.name: getattr(config.optimizer, f.name) for f in dataclasses.fields(config.optimizer)
                 if f.name in known}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"use_fused_amp: unknown option(s) {', '.join(unknown)}; the options are "
                        f"{', '.join(sorted(known))}")
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    fields["optimizer"] = FusedAmpOptimizersContainer.Config(**{**optimizer, **options})
    return FusedAmpTrainer.Config(**fields)
