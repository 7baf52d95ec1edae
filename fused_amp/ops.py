"""Functional API over ``torch.ops.fused_amp``; registers fake kernels for ``torch.compile``."""
import warnings
from typing import Dict, List, Mapping, Optional, Sequence

import torch

import fused_amp._C as _C  # the extension module itself, not the package face
from fused_amp import _fake

# what the C++ side tells the Python layer about its tables (functions, not ops)
_TABLES = ("optimizers", "kept_states", "storage_kinds")
__all__ = ["unscale_", "non_finite_check_", "grad_norm_", "update_scale_", "step_", "delayed_scale_update_",
           "check_step_", *_TABLES]

_ops = torch.ops.fused_amp


def _tensors(op: str, name: str, tensors) -> List[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a list of tensors, got a single Tensor "
                        f"(pass [{name}])")
    return list(tensors)


def _no_tensors(*args) -> bool:
    """True when a step has nothing to update and nothing to check: every list empty and no
    tensor argument (the dispatcher cannot pick a kernel then; torch's foreach ops accept it)."""
    return not any(isinstance(a, torch.Tensor) or (isinstance(a, list) and a) for a in args)


def _tensor(op: str, name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
    return t


def unscale_(tensors: Sequence[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
    r"""Multiply every tensor in place by ``inv_scale`` and flag non-finite values.

    For each element ``x = x * inv_scale``, computed in fp32 (fp64 for fp64 tensors) and rounded
    back to the tensor's dtype. ``found_inf`` (one fp32 element) is set to exactly 1.0 when any
    input element is inf or NaN; it is never cleared and never counted up. ``tensors`` may mix
    fp32, fp16, bf16 and fp64 and hold empty tensors; all must be on ``found_inf``'s device.
    Bitwise equal to ``torch._amp_foreach_non_finite_check_and_unscale_``.
    """
    _ops.unscale_(_tensors("unscale_", "tensors", tensors), _tensor("unscale_", "found_inf", found_inf),
                  _tensor("unscale_", "inv_scale", inv_scale))


def non_finite_check_(tensors: Sequence[torch.Tensor], found_inf: torch.Tensor) -> None:
    """Set ``found_inf`` to 1.0 if any element of ``tensors`` is inf or NaN; reads only."""
    _ops.non_finite_check_(_tensors("non_finite_check_", "tensors", tensors),
                           _tensor("non_finite_check_", "found_inf", found_inf))


def grad_norm_(tensors: Sequence[torch.Tensor], found_inf: torch.Tensor, norm: torch.Tensor,
               inv_scale: Optional[torch.Tensor] = None, norm_type: float = 2.0) -> None:
    r"""Write into ``norm`` the total norm of ``tensors * inv_scale`` and flag inf/NaN; reads only.

    The norm is ``torch.nn.utils.get_total_norm``'s (``norm_type`` 1.0, 2.0 or inf), formed in
    fp32 (fp64 for fp64 tensors) from each element times ``inv_scale`` (1 when None), with a
    fixed summation order: the same bits for any thread count and on every run. An inf or NaN
    element sets ``found_inf`` to 1.0, as :func:`non_finite_check_` does, and makes the norm
    inf or NaN as torch's would be. ``norm`` and ``found_inf`` are one-element fp32 tensors on
    the tensors' device.
    """
    op = "grad_norm_"
    _ops.grad_norm_(_tensors(op, "tensors", tensors), _tensor(op, "found_inf", found_inf),
                    _tensor(op, "norm", norm), inv_scale, float(norm_type))


def update_scale_(scale: torch.Tensor, growth_tracker: torch.Tensor, found_inf: torch.Tensor,
                  growth_factor: float, backoff_factor: float, growth_interval: int, *,
                  hysteresis: int = 1, hysteresis_tracker: Optional[torch.Tensor] = None,
                  min_scale: Optional[float] = None, max_scale: Optional[float] = None) -> None:
    r"""Update the loss scale in place on its device, without a host sync.

    With the defaults this is ``torch._amp_update_scale_``: on overflow (``found_inf != 0``)
    ``scale *= backoff_factor`` and ``growth_tracker = 0``; otherwise ``growth_tracker += 1`` and
    after ``growth_interval`` clean steps ``scale *= growth_factor`` (only if the result is
    finite) and the tracker restarts. With ``hysteresis=N`` the scale backs off only from the
    N-th overflow in a row (``hysteresis_tracker``, an int32 tensor, counts them; a clean step
    resets it). ``min_scale``/``max_scale`` bound the scale.
    """
    op = "update_scale_"
    _ops.update_scale_(_tensor(op, "scale", scale), _tensor(op, "growth_tracker", growth_tracker),
                       _tensor(op, "found_inf", found_inf), growth_factor, backoff_factor,
                       growth_interval, hysteresis=hysteresis, hysteresis_tracker=hysteresis_tracker,
                       min_scale=min_scale, max_scale=max_scale)


def delayed_scale_update_(amax_histories: Sequence[torch.Tensor], scales: Sequence[torch.Tensor],
                          scale_invs: Sequence[torch.Tensor], *, fp8_max: float, margin: float = 0.0,
                          amax_compute_algo: str = "max",
                          amax_reduction_buffer: Optional[torch.Tensor] = None) -> None:
    r"""Update fp8 scales from their amax histories in place, on their device, without a host sync:
    TransformerEngine's delayed scaling recipe (``DelayedScaling``; its
    ``amax_and_scale_update_after_reduction``) over many tensors in one op.

    Each ``amax_histories[i]`` is ``[history length, n_i]`` (one length for all): column ``c``
    holds the amax history of the tensor that ``scales[i][c]`` scales, row 0 the amax seen since
    the last update. ``amax_reduction_buffer`` (all the row-0 amaxes, in order, all-reduced over
    the ranks), where given and nonzero, stands for row 0. For each column whose amax is nonzero
    the history rolls by one (row 0's amax becomes the newest row, the oldest drops out, row 0
    restarts at 0); a column whose amax is 0 (not used this step) keeps its history. Then, with
    :math:`a` the largest value of the history (``amax_compute_algo="max"``; NaN entries
    ignored) or row 0's amax (``"most_recent"``), the scale becomes
    :math:`\mathrm{fp8\_max} \cdot 2^{-\mathrm{margin}} / a` (in fp32) when :math:`a` is finite
    and positive, else it stays; an infinite result becomes the largest fp32 value;
    ``scale_invs[i] = 1 / scales[i]``. The loss scale's update (:func:`update_scale_`) keeps
    one scale for all grads; this keeps one per fp8 tensor.

    Args:
        amax_histories: fp32 ``[history length, n_i]`` tensors (updated in place).
        scales, scale_invs: fp32 tensors of ``n_i`` elements each (updated in place).
        fp8_max: the fp8 format's largest value (448 for e4m3, 57344 for e5m2).
        margin: the scaled amax lands at ``fp8_max * 2**-margin``.
        amax_compute_algo: ``"max"`` or ``"most_recent"``.
        amax_reduction_buffer: fp32, one element per column of all histories, or None.

    Raises:
        ValueError, TypeError: for bad arguments (naming them), before any tensor is written.
    """
    op = "delayed_scale_update_"
    lists = [_tensors(op, "amax_histories", amax_histories), _tensors(op, "scales", scales),
             _tensors(op, "scale_invs", scale_invs)]
    if _no_tensors(*lists, amax_reduction_buffer):
        return
    _ops.delayed_scale_update_(*lists, fp8_max=float(fp8_max), margin=float(margin),
                               amax_compute_algo=amax_compute_algo, amax_reduction_buffer=amax_reduction_buffer)


def optimizers() -> Dict[str, Dict]:
    """The optimizers :func:`step_` runs, from the C++ table (csrc/optimizers.h): for each name,
    ``"states"``, its per-element states as ``(state key, list name, signed)`` (signed: the 8-bit
    map of the state), ``"hyper"``, the names of its hyperparameters, ``"scalar"``, the key of
    its per-param scalar state (or None), ``"scalar_initial"``, that state's first value, and
    ``"writes_output"``: whether the step writes ``outputs`` instead of the params
    (``"muon_momentum"``)."""
    return _OPTIMIZERS


_OPTIMIZERS = _C.optimizers()


def storage_kinds() -> Dict[str, list]:
    """The storage kinds, from the C++ table (csrc/storage_kinds.h): ``"masters"``, where the fp32
    value of a half param can live, and ``"states"``, how optimizer state can be held. Each entry
    has ``"kind"`` (its number in the kernels), ``"option"`` (the ``master_weights`` value, or the
    ``state_dtype``'s name), ``"key"`` (the optimizer-state key of a master), ``"dtype"`` (the
    name of its tensors' torch dtype: 4-bit codes are held in uint8), ``"bits"`` per element,
    ``"block"`` (codes: the elements per absmax; 0 otherwise), ``"bf16_params"`` (the master's
    top half is a bf16 param: bf16 params only) and ``"rounds"`` (it holds the fp32 value rounded,
    to nearest even or stochastically)."""
    return _STORAGE_KINDS


_STORAGE_KINDS = _C.storage_kinds()
_KEPT: Dict[tuple, tuple] = {}


def kept_states(optimizer: str, hyper: Mapping[str, float]) -> tuple:
    """The states the step of ``optimizer`` keeps with these hyperparameters, as ``(state key,
    list name)`` in the order :func:`step_` takes their lists (Adam: ``exp_avg`` and
    ``exp_avg_sq``, and ``max_exp_avg_sq`` with ``amsgrad``). The C++ descriptor decides. (The
    optimizers ask once per change of a group's values: optim/_group_lists.py's Hyper.)"""
    return _kept_states(optimizer, _hyper_values(optimizer, hyper))


def _hyper_values(optimizer: str, hyper: Mapping[str, float]) -> tuple:
    return tuple(float(hyper[n]) for n in _hyper_names(f"kept_states({optimizer})", optimizer, hyper))


@torch.compiler.assume_constant_result  # torch.compile takes the result as a constant of the graph
def _kept_states(optimizer: str, values: tuple) -> tuple:
    kept = _KEPT.get((optimizer, values))
    if kept is None:
        if len(_KEPT) >= 64:  # bounded: a scheduler may change a hyperparameter every step
            _KEPT.clear()
        table = _OPTIMIZERS[optimizer]["states"]
        kept = _KEPT[optimizer, values] = tuple(table[k][:2] for k in _C.kept_states(optimizer, values))
    return kept


def _hyper_names(op: str, optimizer: str, hyper: Mapping[str, float]) -> List[str]:
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"{op.split('(')[0]}: unknown optimizer {optimizer!r}; known: {', '.join(_OPTIMIZERS)}")
    names = _OPTIMIZERS[optimizer]["hyper"]
    if set(hyper) != set(names):
        raise ValueError(f"{op}: hyper has {sorted(hyper)}, expected the hyperparameters {names}")
    return names


# step_'s read-only scalar tensors, in the order of its `scalars` part (csrc/register.cpp)
_SCALARS = ("lr_tensor", "inv_scale", "found_inf", "grad_norm")
# what its `epilogues` part holds, by name (laid out as `epilogue_layout` says: epilogue_parts);
# the optimizers' cached lists hold them under these keys
EPILOGUES = ("weight_amax", "float8_weights", "float8_scales", "float8_scale_invs", "float8_indices")
# the spelling of step_ before its parts (CHANGELOG.md): keyword -> the part that now holds it
_OLD_KEYWORDS = {"lr": "hyper", "max_grad_norm": "hyper", **{k: "scalars" for k in _SCALARS},
                 "rounding_seed": "rounding", "stochastic_codes": "rounding", **{k: "epilogues" for k in EPILOGUES},
                 "check_only": "check_step_"}


def step_(optimizer: str, params: List[torch.Tensor], grads: List[torch.Tensor],
          master_params: List[Optional[torch.Tensor]], states: Sequence[List[torch.Tensor]],
          steps: List[torch.Tensor], *, state_absmaxes: Optional[List[Optional[torch.Tensor]]] = None,
          scalar_states: Optional[List[torch.Tensor]] = None, outputs: Optional[List[torch.Tensor]] = None,
          epilogues=None, epilogue_layout: Optional[List[int]] = None,
          hyper: Mapping[str, float], scalars=None, rounding=None, unscale_grads: bool = True,
          **old_keywords) -> None:
    r"""One fused step of ``optimizer`` (a name of :func:`optimizers`: ``"adam"``, ``"sgd"``,
    ``"lion"``, ...) over all params; see its class in ``fused_amp.optim`` for the rule.

    ``states`` holds the lists of the states the step keeps, in the optimizer's order (Adam:
    ``exp_avgs``, ``exp_avg_sqs``, and ``max_exp_avg_sqs`` with ``amsgrad``; SGD:
    ``momentum_buffers`` with momentum; Lion: ``exp_avgs``), one tensor per param each;
    ``hyper`` maps each of its hyperparameter names (booleans as bools) to its value. An
    optimizer with a per-param scalar state (NAdam's ``mu_product``: ``optimizers()[name]
    ["scalar"]``) takes it in ``scalar_states``, one-element fp32 tensors on the params' device,
    which the step reads and advances (not on an overflow step). An optimizer that writes no
    param (``optimizers()[name]["writes_output"]``) writes its result to ``outputs`` instead:
    bf16 tensors shaped like the params (rounded to nearest even), the params read for their
    shapes and layouts only, no masters. ``"muon_momentum"`` is Muon's momentum pass (see
    ``fused_amp.optim.Muon``): for each element, with :math:`g` the grad times ``inv_scale``
    (and the clip coefficient), :math:`B \leftarrow \mathrm{lerp}(B, g, 1 - \mu)` and the
    output :math:`\mathrm{lerp}(g, B, \mu)` with ``nesterov``, else :math:`B`: torch.optim.Muon's
    steps before Newton-Schulz, each lerp formed as torch's (one fused multiply-add).
    ``master_params[i]`` (fp32) holds the value of a half ``params[i]``, which receives
    ``master.to(dtype)``; an int16 ``master_params[i]`` is the remainder of a bf16 param: the
    param and it hold the fp32 master exactly (its high and low 16 bits, the param rounded to
    nearest with ties away from zero); a uint8 ``master_params[i]`` is the byte of a 24-bit
    master of a bf16 param (the master's bits 8-15 under the param, split as the int16
    remainder; each step's result rounded to 24 bits to nearest even, or stochastically with
    ``rounding_seed``); ``None`` (or an empty list) updates the param in place.
    The state tensors of a param are all fp32 or all bf16 (math in fp32, stored rounded to
    nearest even, or stochastically with ``rounding_seed``: the random bits depend on the seed,
    the step and the element's index only, the same on every device and thread count), or all
    uint8: 8-bit codes in blocks of 256 elements of their memory order (laid out as the param),
    whose fp32 absmax per block ``state_absmaxes[i]`` holds, one row per state list kept, one
    column per block (None for a param whose state is not 8-bit). The maps (signed states, such
    as moments: ``absmax * sign(c) (c/127)^2``; unsigned ones, such as second moments:
    ``absmax * (c/255)^2``) are those of ``fused_amp.optim``'s ``state_dtype=torch.uint8``; the
    update dequantizes, computes as with fp32 state, and requantizes with the block's new absmax:
    to nearest, or with ``stochastic_codes`` (which needs ``rounding_seed``) stochastically, up
    with the probability that makes the value unbiased (the random bits as for bf16 state).
    Or all 4-bit codes (``state_dtype=torch.uint4``): each a contiguous 1-D uint8 tensor of
    ``(numel + 1) // 2`` bytes, two codes per byte (element 2i in the high half) in the param's
    memory order, in blocks of 128 with their absmax rows as above, on torchao's ``AdamW4bit``
    maps, always to nearest; a uint8 state shaped as its param is 8-bit codes.
    Grads are multiplied by ``inv_scale`` when given and, with ``unscale_grads``, left unscaled
    in place (as torch's fused optimizers leave them). When ``found_inf`` is nonzero nothing is
    written and ``steps`` stay as they are; otherwise each step is incremented. With
    ``grad_norm`` (the total norm of the unscaled grads, from :func:`grad_norm_`) and
    ``max_grad_norm`` the grads are also clipped, as ``torch.nn.utils.clip_grad_norm_`` clips
    them: multiplied by ``min(1, max_grad_norm / (grad_norm + 1e-6))``, which the kernels form
    on the device; with ``unscale_grads`` they are left so in place. :func:`check_step_`
    validates the arguments and returns, so that a caller can check several calls before
    running any.
    With ``weight_amax`` (fp32, one element per param, on their device) the step writes each
    param's amax there, ``max(abs(param))`` of the values it wrote (in the param's dtype, as
    fp32): what fp8 scaling reads (``torchao``'s ``precompute_float8_dynamic_scale_for_fsdp``),
    formed in the pass that writes the params instead of a pass of its own. A skipped step
    (``found_inf``) leaves it as it was.
    With ``float8_weights`` the step also writes fp8 copies of some params in that pass:
    ``float8_weights[k]`` (``torch.float8_e4m3fn``) is the copy of
    ``params[float8_indices[k]]``, shaped like it, and ``float8_scales[k]`` (one fp32 element on
    their device) its scale. Each copy is the param as written, times its scale, clamped to the
    e4m3 range and cast to nearest even: bit for bit torchao's cast of the weight
    (``(param.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn)``; of an fp32 param,
    TransformerEngine's cast of the master). The scale must be known before the step: delayed
    scaling's (:func:`delayed_scale_update_`, whose amax history takes this step's
    ``weight_amax``). With ``float8_scale_invs`` (one fp32 element per copy; optional) the step
    writes ``1 / scale`` there: the copy's dequantization scale as of its cast. A copy whose
    ``float8_scales[k]`` is ``torch.float8_e8m0fnu`` (or its bytes as ``torch.uint8``, which
    torch.compile can trace the step writing), shaped like the param with its last dim divided by
    32 (the param contiguous, its last dim a multiple of 32), is an MX copy (MXFP8) instead: the step writes there the scale of each block of 32 elements along the last dim, a
    power of two from the block's amax, and casts each block by its own scale, bit for bit
    torchao's ``to_mx(param, torch.float8_e4m3fn, 32)`` (its default FLOOR mode); its entry of
    ``float8_scale_invs``, where that list is given, is an empty tensor. A skipped step writes no
    copy, no scale and no inverse.
    Tensors in other layouts than their param (or not dense) are handled through copies.

    The arguments are the op's parts, one role each (``torch.ops.fused_amp.step_`` takes 15):

    Args:
        optimizer: the optimizer's name.
        params, grads, master_params: the params (updated in place), their grads, their masters
            (``None``, or an empty tensor, where a param has none).
        states: the lists of the states kept, as described above.
        steps: one-element fp32 step counts, one per param, on the params' device (SGD without
            momentum: optional, for the random bits of stochastic rounding).
        state_absmaxes, scalar_states, outputs: as described above.
        epilogues: what the step writes besides the params, by name: ``weight_amax``,
            ``float8_weights``, ``float8_scales``, ``float8_scale_invs`` and ``float8_indices``,
            as described above (or the op's own form: a list of tensors, which
            ``epilogue_layout`` describes).
        epilogue_layout: with ``epilogues`` by name, none (it is formed from them).
        hyper: the optimizer's hyperparameters by name, as its torch.optim class takes them,
            with ``lr`` (the learning rate) and, for clipping, ``max_grad_norm``.
        scalars: the read-only scalar tensors by name: ``lr_tensor`` (a one-element tensor
            holding the learning rate; then ``hyper["lr"]`` is ignored), ``inv_scale``,
            ``found_inf`` and ``grad_norm``, as described above; None: none of them.
        rounding: None (to nearest) or ``{"seed": rounding_seed, "stochastic_codes": bool}``, as
            described above.
        unscale_grads: as described above.

    The keywords this function took before its parts (``lr``, ``lr_tensor``, ``inv_scale``,
    ``found_inf``, ``grad_norm``, ``max_grad_norm``, ``rounding_seed``, ``stochastic_codes``,
    ``weight_amax``, the ``float8_*`` lists and ``check_only``, now :func:`check_step_`) still
    work for this release, with a ``DeprecationWarning``.

    Raises:
        ValueError, TypeError: for bad arguments (naming them), before any tensor is written.
    """
    _step(False, optimizer, params, grads, master_params, states, steps, state_absmaxes, scalar_states,
          outputs, epilogues, epilogue_layout, hyper, scalars, rounding, unscale_grads, old_keywords)


def check_step_(optimizer: str, params: List[torch.Tensor], grads: List[torch.Tensor],
                master_params: List[Optional[torch.Tensor]], states: Sequence[List[torch.Tensor]],
                steps: List[torch.Tensor], *, state_absmaxes: Optional[List[Optional[torch.Tensor]]] = None,
                scalar_states: Optional[List[torch.Tensor]] = None, outputs: Optional[List[torch.Tensor]] = None,
                epilogues=None, epilogue_layout: Optional[List[int]] = None,
                hyper: Mapping[str, float], scalars=None, rounding=None, unscale_grads: bool = True) -> None:
    """Validate the arguments of :func:`step_` as it does, and write nothing: so that a caller can
    check several calls before running any (``torch.ops.fused_amp_check.step_``). While
    torch.compile traces, nothing: the fake kernels of the calls traced check them all."""
    if torch.compiler.is_compiling():
        return
    _step(True, optimizer, params, grads, master_params, states, steps,
          state_absmaxes, scalar_states, outputs, epilogues, epilogue_layout, hyper, scalars, rounding,
          unscale_grads, {})


def _by_name(op: str, part: str, given, names) -> dict:
    unknown = set(given) - set(names)
    if unknown:
        raise ValueError(f"{op}: {part} has {sorted(unknown)}, which it does not take; it takes {list(names)}")
    return dict(given)


def epilogue_parts(op: str, epilogues: Mapping) -> tuple:
    """(epilogues, epilogue_layout) of step_'s schema from its epilogues by name."""
    e = _by_name(op, "epilogues", epilogues, EPILOGUES)
    weights = _tensors(op, "float8_weights", e.get("float8_weights") or [])
    scales = _tensors(op, "float8_scales", e.get("float8_scales") or [])
    invs = _tensors(op, "float8_scale_invs", e.get("float8_scale_invs") or [])
    indices = list(e.get("float8_indices") or [])
    if len(scales) != len(weights) or len(indices) != len(weights):
        raise ValueError(f"{op}: float8_weights has {len(weights)} tensors; float8_scales ({len(scales)}) and "
                         f"float8_indices ({len(indices)}) need as many")
    if invs and len(invs) != len(weights):
        raise ValueError(f"{op}: float8_scale_invs has {len(invs)} tensors but float8_weights has {len(weights)} "
                         "(or pass none)")
    amax = e.get("weight_amax")
    if amax is None and not weights:
        return [], []
    tensors = ([_tensor(op, "weight_amax", amax)] if amax is not None else []) + weights + scales + invs
    return tensors, [int(amax is not None), int(bool(invs)), *indices]


def _from_old_keywords(op: str, old: dict, hyper: dict, scalars, rounding, epilogues):
    """step_'s parts from the keywords it took before them (deprecated: CHANGELOG.md)."""
    unknown = set(old) - set(_OLD_KEYWORDS)
    if unknown:
        raise TypeError(f"step_() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    if not torch.compiler.is_compiling():  # (Dynamo cannot trace a warning: it would break the graph)
        warnings.warn(f"{op}: the keywords {sorted(old)} are deprecated and will be removed in the next release; "
                      f"pass them in step_'s parts: {sorted({_OLD_KEYWORDS[k] for k in old})} (CHANGELOG.md)",
                      DeprecationWarning, stacklevel=3)
    hyper = dict(hyper)
    for key in ("lr", "max_grad_norm"):
        if key in old:
            hyper[key] = old[key]
    if any(k in old for k in _SCALARS):
        scalars = dict(scalars or {}, **{k: old[k] for k in _SCALARS if k in old})
    if old.get("rounding_seed") is not None or old.get("stochastic_codes"):
        rounding = {"seed": old.get("rounding_seed"), "stochastic_codes": bool(old.get("stochastic_codes"))}
    if any(k in old for k in EPILOGUES):
        epilogues = dict(epilogues or {}, **{k: old[k] for k in EPILOGUES if k in old})
    return hyper, scalars, rounding, epilogues


def _step(check_only, optimizer, params, grads, master_params, states, steps, state_absmaxes, scalar_states,
          outputs, epilogues, epilogue_layout, hyper, scalars, rounding, unscale_grads, old) -> None:
    op = f"step_({optimizer})"
    if old:
        check_only = old.pop("check_only", False)
        hyper, scalars, rounding, epilogues = _from_old_keywords(op, old, hyper, scalars, rounding, epilogues)
        if check_only and torch.compiler.is_compiling():
            return
    hyper = dict(hyper)
    lr, max_grad_norm = hyper.pop("lr", None), hyper.pop("max_grad_norm", None)
    if lr is None:
        raise ValueError(f"{op}: hyper has no 'lr'")
    names = _hyper_names(op, optimizer, hyper)
    lists = [_tensors(op, "params", params), _tensors(op, "grads", grads),
             _tensors(op, "master_params", master_params)]
    # each state list by its name (exp_avgs, ...) where as many are given as the step keeps
    kept = [name for _, name in kept_states(optimizer, hyper)]
    labels = kept if len(kept) == len(states) else [f"states[{k}]" for k in range(len(states))]
    state_lists = [_tensors(op, label, s) for label, s in zip(labels, states)]
    for label, s in zip(labels, state_lists):
        if len(s) != len(lists[0]):
            raise ValueError(f"{op}: {label} has {len(s)} tensors but params has {len(lists[0])}")
    steps = _tensors(op, "steps", steps)
    absmaxes = _tensors(op, "state_absmaxes", state_absmaxes or [])
    scalar_list = _tensors(op, "scalar_states", scalar_states or [])
    outputs = _tensors(op, "outputs", outputs or [])
    if isinstance(epilogues, Mapping):
        epilogues, epilogue_layout = epilogue_parts(op, epilogues)
    epilogues = _tensors(op, "epilogues", epilogues or [])
    if isinstance(scalars, Mapping):
        scalars = [_by_name(op, "scalars", scalars, _SCALARS).get(k) for k in _SCALARS]
    scalars = list(scalars or [])
    if max_grad_norm is None and len(scalars) == 4 and scalars[3] is not None:
        raise ValueError(f"{op}: grad_norm and max_grad_norm go together (clipping needs both)")
    if max_grad_norm is not None and (len(scalars) < 4 or scalars[3] is None):
        raise ValueError(f"{op}: grad_norm and max_grad_norm go together (clipping needs both)")
    if isinstance(rounding, Mapping):
        r = _by_name(op, "rounding", rounding, ("seed", "stochastic_codes"))
        if r.get("stochastic_codes") and r.get("seed") is None:
            raise ValueError(f"{op}: stochastic_codes=True rounds 8-bit codes with rounding_seed, which is None")
        rounding = [] if r.get("seed") is None else [int(r["seed"]), int(bool(r.get("stochastic_codes")))]
    if _no_tensors(*lists, *state_lists, steps, absmaxes, scalar_list, outputs, epilogues,
                   *(t for t in scalars if t is not None)):
        return
    call_step(check_only, optimizer, lists[0], lists[1], _none_as_empty(lists[2], lists[0]),
              [t for s in state_lists for t in s], steps, _none_as_empty(absmaxes, lists[0]), scalar_list, outputs,
              epilogues, [int(i) for i in epilogue_layout or []],
              [float(hyper[n]) for n in names] + [float(lr), float(max_grad_norm or 0.0)],
              scalars, [int(i) for i in rounding or []], bool(unscale_grads))


# step_'s keyword-only parts, in its schema's order (csrc/register.cpp)
_KEYWORD_PARTS = ("state_absmaxes", "scalar_states", "outputs", "epilogues", "epilogue_layout", "hyper", "scalars",
                  "rounding", "unscale_grads")


def call_step(check_only: bool, *parts) -> None:
    """``torch.ops.fused_amp.step_`` (``fused_amp_check.step_`` with ``check_only``) on its 15
    parts in the schema's order, as lists (``epilogue_layout`` and ``rounding`` of ints,
    ``hyper`` of floats): called from C++ through the dispatcher (csrc/py_step.h), which costs a
    quarter of torch.ops' boxing from Python; through torch.ops where a tensor's
    ``__torch_function__`` or a torch-function mode asks for Python, and while torch.compile
    traces."""
    if torch.compiler.is_compiling() or _C.call_step(check_only, *parts) is NotImplemented:
        op = torch.ops.fused_amp_check.step_ if check_only else _ops.step_
        op(*parts[:6], **dict(zip(_KEYWORD_PARTS, parts[6:])))


def _none_as_empty(tensors: List[Optional[torch.Tensor]], params: List[torch.Tensor]) -> List[torch.Tensor]:
    """A list of step_'s that may leave entries out, with an empty tensor for each None (the op's
    lists hold no None: torch.compile's functionalization refuses them in a written list). The
    optimizers' cached lists hold empty tensors already."""
    if all(t is not None for t in tensors):
        return tensors
    return [torch.empty(0, device=p.device) if t is None else t for t, p in zip(tensors, params)]


_REMOVED = ("adam_step_", "sgd_step_", "lion_step_", "muon_momentum_")


def __getattr__(name):
    if name in _REMOVED:  # (CHANGELOG.md)
        optimizer = name[:-len("_step_")] if name.endswith("_step_") else "muon_momentum"
        raise AttributeError(f"fused_amp.ops.{name} was removed: use fused_amp.ops.step_({optimizer!r}, ...), "
                             "which steps every optimizer of fused_amp.ops.optimizers() (CHANGELOG.md)")
    raise AttributeError(f"module 'fused_amp.ops' has no attribute {name!r}")


_fake.register([op for op in __all__ if op not in (*_TABLES, "check_step_")])
