"""The checks a state dict passes before an optimizer loads it.

torch loads many state dicts that cannot step correctly (a moment of the wrong shape, a NaN
step count, a string where a tensor goes) and fails at the next step, or steps wrong. Here
each is refused before anything is replaced, naming the entry, so the optimizer keeps its
previous state. What torch loads and steps correctly (extra keys, moments in another float
dtype, legacy Python-number steps, options added in later versions missing) loads here too."""
import math
import numbers
from collections.abc import Mapping
from typing import Dict, List, Tuple

import torch

from fused_amp.optim import _grad_norm, _memory, _quantize
from fused_amp.optim._grad_norm import CLIP_OPTIONS, check_clip_options, check_same_clip_options

# moments that are squares: never negative
_SQUARES = ("exp_avg_sq", "max_exp_avg_sq")
# state a param may hold as None (torch.optim.SGD saves a missing buffer so)
_MAY_BE_NONE = ("momentum_buffer",)
# group options of ours that a torch checkpoint lacks: this optimizer's stay
_OURS = ("rounding_seed",) + CLIP_OPTIONS
# what torch's Optimizer puts into `defaults` itself whenever it sets its state (deepcopy,
# unpickling, load_state_dict): a checkpoint whose groups lack it (Muon's, torch's and ours)
# loads all the same, as into torch's
_ADDED_BY_TORCH = ("differentiable",)


def check_loadable(optimizer, state_dict, name: str) -> Tuple[List[Dict], Mapping]:
    """Raise (naming the entry) if ``state_dict`` is not one that ``optimizer`` can load and step
    correctly with; change nothing. Returns the options each group will have after loading (the
    clip options: the checkpoint's, or this optimizer's where it has none, as a torch.optim
    checkpoint or one from before they were group options), and the state to load: the
    checkpoint's, with the 8-bit codes of a compact one (``state_dict(compact=True)``) as the
    fp32 moments they hold (quantized again, they give the same codes: the resume is exact).
    4-bit codes are kept as they are where the param keeps 4-bit state: torchao's signed map
    has no -1, so a block whose largest magnitude is negative would not quantize back to them."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"{name}: expected a state dict (a dict), got {type(state_dict).__name__}")
    for key in ("state", "param_groups"):
        if key not in state_dict:
            raise KeyError(f"{name}: the state dict has no {key!r}")
    saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
    if not isinstance(saved_groups, (list, tuple)):
        raise TypeError(f"{name}: 'param_groups' is a {type(saved_groups).__name__}, not a list")
    if not isinstance(saved_state, Mapping):
        raise TypeError(f"{name}: 'state' is a {type(saved_state).__name__}, not a dict")
    if len(saved_groups) != len(optimizer.param_groups):  # torch's message
        raise ValueError("loaded state dict has a different number of parameter groups")
    owners: Dict = {}  # saved param id -> (param, its options after loading)
    loaded = []
    for index, (saved, group) in enumerate(zip(saved_groups, optimizer.param_groups)):
        where = f"{name}: param_groups[{index}]"
        options = _loaded_options(optimizer, saved, group, where)
        loaded.append(options)
        for saved_id, p in zip(saved["params"], group["params"]):
            if saved_id in owners:
                raise ValueError(f"{where}: param id {saved_id!r} appears more than once")
            owners[saved_id] = (p, options)
    check_same_clip_options(name, loaded)
    expanded = {}
    for saved_id, entry in saved_state.items():
        if saved_id not in owners:
            continue  # torch keeps state of params it does not know, unused
        p, options = owners[saved_id]
        _check_param_state(optimizer, p, options, entry, f"{name}: state[{saved_id!r}]")
        if _quantize.ABSMAX in entry and not _keeps_codes(p, options, entry, optimizer._state_keys_for(options)):
            expanded[saved_id] = _fp32_entry(p, entry, optimizer._state_keys_for(options))
    return loaded, ({**saved_state, **expanded} if expanded else saved_state)


def _codes_held(entry, moments) -> List[str]:
    """The moments a compact entry holds as codes: one absmax row each, in this order."""
    return [k for k in moments if isinstance(entry.get(k), torch.Tensor) and entry[k].dtype == torch.uint8]


def _keeps_codes(p, options, entry, moments) -> bool:
    """Whether a compact entry's codes load as they are: 4-bit codes, for a param that keeps
    4-bit state (not a DTensor: those are refused earlier)."""
    held = _codes_held(entry, moments)
    return (bool(held) and options["state_dtype"] == torch.uint4 and _memory.quantized(p, options)
            and all(_quantize.packed(entry[k], p) for k in held))


def _fp32_entry(p, entry, moments):
    out = {k: v for k, v in entry.items() if k != _quantize.ABSMAX}
    absmax = entry[_quantize.ABSMAX]
    for row, key in enumerate(_codes_held(entry, moments)):
        out[key] = _quantize.dequantize(entry[key], absmax[row], key in _memory.SIGNED_STATES, p.detach())
    return out


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill its storage span exactly once (any order of dims)."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _check_compact_state(p, moments, entry, where):
    """A compact entry of codes: uint8 codes under the moments' names, all 8-bit (shaped as the
    param and dense) or all 4-bit (1-D, two per byte), and ``state_absmax`` with one row of block
    absmaxes (finite, >= 0) per code tensor."""
    absmax, what = entry[_quantize.ABSMAX], f"{where}[{_quantize.ABSMAX!r}]"
    if _grad_norm.DTensor is not None and isinstance(p, _grad_norm.DTensor):
        raise ValueError(f"{what}: a compact checkpoint of codes holds each rank's own absmax rows and "
                         "cannot be resharded; save DTensor (FSDP2) params with state_dict() (fp32 moments)")
    for key in moments:
        value = entry.get(key)
        if isinstance(value, torch.Tensor) and value.dtype != torch.uint8:
            raise TypeError(f"{where}[{key!r}] has dtype {value.dtype}; beside {_quantize.ABSMAX!r} "
                            "the moments are 8- or 4-bit codes (torch.uint8)")
    held = _codes_held(entry, moments)
    if not held:
        raise ValueError(f"{what} is given but no moment holds uint8 codes")
    if not isinstance(absmax, torch.Tensor):
        raise TypeError(f"{what} is a {type(absmax).__name__}, not a tensor")
    if absmax.dtype != torch.float32:
        raise TypeError(f"{what} has dtype {absmax.dtype}, expected torch.float32")
    four = [_quantize.packed(entry[key], p) for key in held]
    if any(four) != all(four):
        raise ValueError(f"{where}: the codes of {', '.join(held)} mix 4-bit (1-D, two per byte) and 8-bit ones")
    block = _quantize.QUANT4_BLOCK if four[0] else _quantize.QUANT_BLOCK
    shape = (len(held), _quantize.blocks_of(p.numel(), block))
    if tuple(absmax.shape) != shape:
        raise ValueError(f"{what} has shape {tuple(absmax.shape)}, expected {shape} (one row per "
                         f"code tensor ({', '.join(held)}), one absmax per block of {block})")
    if not bool(torch.isfinite(absmax).all()) or bool((absmax < 0).any()):
        raise ValueError(f"{what} holds inf, NaN or negative values (each is a block's largest |value|)")
    for key in held:
        codes = entry[key]
        if four[0]:
            if not codes.is_contiguous():
                raise ValueError(f"{where}[{key!r}]: 4-bit codes must be contiguous")
            continue
        if codes.shape != p.shape:
            raise ValueError(f"{where}[{key!r}] has shape {tuple(codes.shape)}, the param {tuple(p.shape)}")
        if not _dense(codes):
            raise ValueError(f"{where}[{key!r}]: 8-bit codes must be dense (their blocks follow memory order)")


def _loaded_options(optimizer, saved, group, where):
    """The options a group will have after loading ``saved``, checked as the constructor checks
    them (the memory options stay this optimizer's)."""
    if not isinstance(saved, Mapping):
        raise TypeError(f"{where} is a {type(saved).__name__}, not a dict")
    params = saved.get("params")
    if not isinstance(params, (list, tuple)):
        raise TypeError(f"{where}['params'] is {type(params).__name__}, not a list of param ids")
    if len(params) != len(group["params"]):  # torch's message
        raise ValueError("loaded state dict contains a parameter group that doesn't match the "
                         "size of optimizer's group")
    for i, saved_id in enumerate(params):
        if isinstance(saved_id, bool) or not isinstance(saved_id, (int, str)):
            raise TypeError(f"{where}['params'][{i}] is {saved_id!r}, not a param id")
    options = dict(optimizer._group_defaults)
    options.update((k, v) for k, v in saved.items() if k != "params")
    options.update((k, group[k]) for k in _memory.MEMORY_OPTIONS)
    options.update((k, saved.get(k, group[k])) for k in CLIP_OPTIONS)
    try:
        check_clip_options(options["max_grad_norm"], options["grad_norm_type"])
    except (TypeError, ValueError) as e:
        raise type(e)(f"{where}: {e}") from None
    options["grad_norm_type"] = float(options["grad_norm_type"])
    # the options of torch's constructor (ours, clip options included, stay when missing)
    missing = [k for k in optimizer.defaults if k not in options and k not in _OURS + _ADDED_BY_TORCH]
    if missing:
        raise KeyError(f"{where} has no {missing[0]!r}")
    try:
        optimizer._check_hyperparameters(options)
    except (TypeError, ValueError, RuntimeError) as e:
        raise type(e)(f"{where}: {e}") from None
    except (IndexError, KeyError) as e:  # betas too short, or not a sequence
        raise ValueError(f"{where}: malformed option: {e!r}") from None
    for key, value in options.items():  # a NaN hyperparameter passes torch's checks
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, float) and math.isnan(value):
            raise ValueError(f"{where}[{key!r}] is NaN")
        if key == "betas" and any(isinstance(b, float) and math.isnan(b) for b in value):
            raise ValueError(f"{where}['betas'] holds NaN")
    return options


def _check_param_state(optimizer, p, options, entry, where):
    if not isinstance(entry, Mapping):
        raise TypeError(f"{where} is a {type(entry).__name__}, not a dict")
    moments = optimizer._state_keys_for(options)
    codes = []
    if _quantize.ABSMAX in entry:
        _check_compact_state(p, moments, entry, where)
        codes = _codes_held(entry, moments)
    for key in _memory.REMAINDER_KEYS:
        if key in entry:
            raise ValueError(f"{where}[{key!r}]: checkpoints hold the fp32 'master_param' "
                             "(state_dict() writes it), not the remainder")
    # a param that has stepped holds what its next update needs (torch's step: KeyError); a
    # step count of 0 with no moments is a param that never stepped (they start at zero)
    if "step" in entry:
        if _check_step(entry["step"], f"{where}['step']") > 0:
            for key in moments:
                if entry.get(key) is None:
                    raise KeyError(f"{where} has no {key!r}, but its step count is not 0")
    elif optimizer._step_count_saved and any(entry.get(key) is not None for key in moments):
        raise KeyError(f"{where} has no 'step'")
    for key in moments + (_memory.MASTER,):
        if key not in entry or (entry[key] is None and key in _MAY_BE_NONE):
            continue
        value = entry[key]
        what = f"{where}[{key!r}]"
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{what} is a {type(value).__name__}, not a tensor")
        if key in codes:
            continue  # checked above
        if not value.is_floating_point():
            raise TypeError(f"{what} has dtype {value.dtype}, not a floating-point one")
        if value.shape != p.shape:
            raise ValueError(f"{what} has shape {tuple(value.shape)}, the param {tuple(p.shape)}")
        # moments of a run are finite (an overflow step is skipped); a master is a weight, which
        # may be anything a model holds, as torch's model.load_state_dict takes it
        if key != _memory.MASTER and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{what} holds inf or NaN")
        if key in _SQUARES and bool((value < 0).any()):
            raise ValueError(f"{what} holds negative values (it is a mean of squares)")
    if _memory.MASTER in entry and p.dtype == torch.float32:
        raise ValueError(f"{where}['master_param']: the param is float32 and has no master")


def _check_step(step, what):
    if isinstance(step, torch.Tensor):
        if step.numel() != 1 or step.is_complex() or step.dtype == torch.bool:
            raise ValueError(f"{what} must be a number or a 1-element real tensor, got "
                             f"{step.dtype} of shape {tuple(step.shape)}")
        step = step.item()
    elif isinstance(step, bool) or not isinstance(step, numbers.Real):
        raise TypeError(f"{what} must be a number or a 1-element tensor, got {type(step).__name__}")
    if not (math.isfinite(step) and step >= 0 and float(step).is_integer()):
        raise ValueError(f"{what} must be a count of steps (a whole number >= 0), got {step}")
    return step
