"""The memory modes: where the fp32 value of a half param lives (``master_weights``) and the
dtype of the optimizer state (``state_dtype``: fp32, bf16 with optional stochastic rounding, or
8- or 4-bit blockwise codes, fused_amp/optim/_quantize.py)."""
from typing import Optional, Tuple

import torch

from fused_amp import ops
from fused_amp.optim import _quantize
from fused_amp.optim._grad_norm import DTensor, local_shard

# the storage kinds (csrc/storage_kinds.h): each master kind by its master_weights value, with its
# state key and dtype ("fp32": "master_param"; "remainder": "master_remainder", the int16 low
# half of a bf16 param's master; "remainder8": "master_remainder8", the uint8 bits 8-15 of a
# 24-bit master), and the state dtypes
MASTER_KINDS = {kind["option"]: kind for kind in ops.storage_kinds()["masters"]}
MASTER = MASTER_KINDS["fp32"]["key"]
MASTER_KEYS = tuple(kind["key"] for kind in MASTER_KINDS.values())  # a param holds at most one
# the keys of the masters a bf16 param is part of; checkpoints hold them as fp32 masters
REMAINDER_KEYS = tuple(kind["key"] for kind in MASTER_KINDS.values() if kind["bf16_params"])
MASTER_WEIGHTS = (True, False) + tuple(MASTER_KINDS)
# the state kinds by their option, the state_dtype (torch.uint4: 4-bit codes, held in uint8 tensors)
STATE_KINDS = {getattr(torch, kind["option"]): kind for kind in ops.storage_kinds()["states"]}
STATE_DTYPES = tuple(STATE_KINDS)
# the 8-bit map of each state, from the optimizers' table (csrc/optimizers.h): signed for moments,
# unsigned for second moments and sums
SIGNED_STATES = frozenset(key for entry in ops.optimizers().values() for key, _, signed in entry["states"] if signed)
# how the optimizer stores its state, which a loaded checkpoint does not change
MEMORY_OPTIONS = ("master_weights", "state_dtype", "stochastic_rounding", "min_8bit_size")


def master_kind(group) -> Optional[str]:
    """None (params updated in place) or the master kind's option ("fp32", "remainder",
    "remainder8"), from a group's master_weights."""
    mw = group["master_weights"]
    return mw if isinstance(mw, str) else ("fp32" if mw else None)


def rounded_master(master_weights) -> bool:
    """Whether the master kind holds the fp32 value rounded (24-bit masters)."""
    return isinstance(master_weights, str) and MASTER_KINDS[master_weights]["rounds"]


# the state kinds that round stochastically with stochastic_rounding=True (4-bit codes round to
# nearest: their maps are not uniform, csrc/ops/quantize4.h)
_STOCHASTIC_STATES = (torch.bfloat16, torch.uint8)


def rounded_state(state_dtype) -> bool:
    """Whether the state kind holds fp32 values rounded (bf16 state, 8-bit codes)."""
    return STATE_KINDS[state_dtype]["rounds"]


def stochastic(group, sums: bool = False) -> bool:
    """Whether what the group stores in fewer than 32 bits rounds stochastically: as
    ``stochastic_rounding`` says, or by default (None) for 24-bit masters, whose rounding to
    nearest drops updates below half their ulp (README, "Numerics"), and for the state of an
    optimizer whose state is a running sum (``sums``: Adagrad), which would drop its increments."""
    sr = group["stochastic_rounding"]
    if sr is None:
        return rounded_master(group["master_weights"]) or (sums and rounded_state(group["state_dtype"]))
    return bool(sr)


def check_memory_options(name: str, master_weights, state_dtype, stochastic_rounding,
                         rounding_seed, min_8bit_size=_quantize.MIN_8BIT_SIZE) -> int:
    """Refuse what the memory options cannot be; returns the rounding seed to keep: when not
    given, the seed of torch's default generator (``torch.manual_seed`` decides it; nothing is
    drawn from the generator, so building an optimizer leaves the random stream as it was)."""
    choices = ", ".join(map(repr, MASTER_WEIGHTS[:-1])) + f" or {MASTER_WEIGHTS[-1]!r}"
    if isinstance(master_weights, str) and master_weights not in MASTER_WEIGHTS:
        raise ValueError(f"{name}: master_weights must be {choices}, got {master_weights!r}")
    if not isinstance(master_weights, (bool, str)):
        raise TypeError(f"{name}: master_weights must be {choices}, got {type(master_weights).__name__}")
    if state_dtype not in STATE_DTYPES:
        raise ValueError(f"{name}: state_dtype must be torch.float32, torch.bfloat16, torch.uint8 "
                         f"(8-bit codes) or torch.uint4 (4-bit codes), got {state_dtype}")
    if isinstance(min_8bit_size, bool) or not isinstance(min_8bit_size, int) or min_8bit_size < 0:
        raise ValueError(f"{name}: min_8bit_size must be an int >= 0, got {min_8bit_size!r}")
    if stochastic_rounding is not None and not isinstance(stochastic_rounding, bool):
        raise TypeError(f"{name}: stochastic_rounding must be True, False or None, "
                        f"got {type(stochastic_rounding).__name__}")
    if stochastic_rounding and state_dtype not in _STOCHASTIC_STATES and not rounded_master(master_weights):
        raise ValueError(f"{name}: stochastic_rounding=True rounds bf16 state, 8-bit codes and 24-bit "
                         f"masters; it needs state_dtype=torch.bfloat16 or torch.uint8 or "
                         f"master_weights='remainder8', got state_dtype={state_dtype} and "
                         f"master_weights={master_weights!r}")
    if rounding_seed is None:
        return torch.initial_seed() % 2**63
    if isinstance(rounding_seed, bool) or not isinstance(rounding_seed, int):
        raise TypeError(f"{name}: rounding_seed must be an int or None, got {type(rounding_seed).__name__}")
    return rounding_seed


def check_group_params(name: str, group, index: int):
    """master_weights="remainder" keeps the master in a bf16 param's low half: bf16 params only.
    Codes (8- and 4-bit state) have CPU and CUDA kernels."""
    if group["state_dtype"] in _quantize.CODE_DTYPES:
        for i, p in enumerate(group["params"]):
            where = f"param {i} of group {index}"
            if p.device.type not in ("cpu", "cuda") and quantized(p, group):
                raise ValueError(f"{name}: state_dtype={group['state_dtype']} has CPU and CUDA kernels only; "
                                 f"{where} is on {p.device}")
    kind = master_kind(group)
    if kind is None or not MASTER_KINDS[kind]["bf16_params"]:
        return
    bits = MASTER_KINDS[kind]["bits"]
    for i, p in enumerate(group["params"]):
        if p.dtype != torch.bfloat16:
            raise ValueError(f"{name}: master_weights={kind!r} needs bfloat16 params (the master is "
                             f"the param plus a {bits}-bit remainder); param {i} of group {index} is {p.dtype}")


def stochastic_codes(group, sums: bool = False) -> bool:
    """Whether the group's 8-bit codes round stochastically: with ``stochastic_rounding=True``,
    or by default (None) for a running sum's (``sums``; otherwise the default is stochastic for
    24-bit masters alone)."""
    sr = group["stochastic_rounding"]
    return (sr is True or (sr is None and sums)) and group["state_dtype"] == torch.uint8


def rounding_seed_of(group, sums: bool = False) -> Optional[int]:
    """The seed the fused op takes: set only when bf16 state, 24-bit masters or 8-bit codes
    round stochastically (the op rounds bf16 state and 24-bit masters so whenever it has a seed,
    and codes where ``stochastic_codes`` says)."""
    if stochastic_codes(group, sums) or (stochastic(group, sums) and (group["state_dtype"] == torch.bfloat16
                                                                      or rounded_master(group["master_weights"]))):
        return group["rounding_seed"]
    return None


# ---- masters as (bf16 param, int16 remainder): the bits of csrc/ops/rounding.h --------------

def _int16(x: torch.Tensor) -> torch.Tensor:
    """16-bit patterns held in int64 as int16 (patterns >= 0x8000 become negative)."""
    return (x - ((x >> 15) << 16)).to(torch.int16)


def _on_locals(fn, like: torch.Tensor, *tensors):
    """fn on the local shards of DTensors (FSDP2), wrapped back as ``like`` is placed."""
    if DTensor is None or not isinstance(like, DTensor):
        return fn(*tensors)
    out = fn(*(local_shard(t) for t in tensors))
    wrap = lambda x: DTensor.from_local(x, like.device_mesh, like.placements,  # noqa: E731
                                        shape=like.shape, stride=like.stride())
    return tuple(map(wrap, out)) if isinstance(out, tuple) else wrap(out)


def split_master(master: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(bf16 param, int16 remainder) holding an fp32 master exactly: the param is the master
    rounded to nearest with ties away from zero, the remainder its low 16 bits."""
    def split(m):
        bits = m.view(torch.int32).to(torch.int64) & 0xffffffff
        high = torch.where(m.isnan(), (bits >> 16) | 0x40, (bits + 0x8000) >> 16) & 0xffff
        return _int16(high).view(torch.bfloat16), _int16(bits & 0xffff)
    return _on_locals(split, master, master)


def join_master(param: torch.Tensor, remainder: torch.Tensor) -> torch.Tensor:
    """The fp32 master a bf16 param and its remainder hold."""
    def join(p, r):
        high = p.view(torch.int16).to(torch.int64) & 0xffff
        low = r.to(torch.int64) & 0xffff
        bits = ((high - (low >> 15)) << 16) | low
        return (bits - ((bits >> 31) << 32)).to(torch.int32).view(torch.float32)
    return _on_locals(join, param, param.detach(), remainder)


# ---- 24-bit masters as (bf16 param, uint8 byte) -------------------------------------------------

def round_to_24(master: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded to 24 bits (low 8 bits zero), to nearest even; NaNs stay NaN."""
    bits = master.view(torch.int32).to(torch.int64) & 0xffffffff
    rounded = torch.where(master.isnan(), bits | 0x400000, bits + 0x7f + ((bits >> 8) & 1)) & 0xffffff00
    return (rounded - ((rounded >> 31) << 32)).to(torch.int32).view(torch.float32)


def split_master24(master: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(bf16 param, uint8 byte) holding an fp32 master rounded to 24 bits (to nearest even): the
    param as :func:`split_master` gives it, the byte the 24-bit master's bits 8-15."""
    def split(m):
        m24 = round_to_24(m)
        high, _ = split_master(m24)
        return high, ((m24.view(torch.int32).to(torch.int64) >> 8) & 0xff).to(torch.uint8)
    return _on_locals(split, master, master)


def join_master24(param: torch.Tensor, remainder8: torch.Tensor) -> torch.Tensor:
    """The 24-bit master (as fp32) a bf16 param and its byte hold."""
    def join(p, r):
        high = p.view(torch.int16).to(torch.int64) & 0xffff
        byte = r.to(torch.int64)
        bits = ((high - (byte >> 7)) << 16) | (byte << 8)
        return (bits - ((bits >> 31) << 32)).to(torch.int32).view(torch.float32)
    return _on_locals(join, param, param.detach(), remainder8)


# each remainder kind's bits (csrc/ops/rounding.h) in torch ops, by its master_weights value
_SPLIT = {"remainder": split_master, "remainder8": split_master24}
_JOIN = {"remainder": join_master, "remainder8": join_master24}
assert set(_SPLIT) == {kind for kind, entry in MASTER_KINDS.items() if entry["bf16_params"]}


def master_of(p: torch.Tensor, state) -> Optional[torch.Tensor]:
    """The fp32 master a param's state holds, in whichever form it is kept; None without one."""
    for kind, join in _JOIN.items():
        if MASTER_KINDS[kind]["key"] in state:
            return join(p, state[MASTER_KINDS[kind]["key"]])
    return state.get(MASTER)


def bring_master(p: torch.Tensor, group, state) -> None:
    """Keep a param's master in its group's form (``master_weights``), converting one that a
    checkpoint or a change of mode left in another: the param becomes the high half of a
    master split into a remainder. A bf16 param without a master is its own (zero remainder);
    with master_weights=False a master that is there stays, as an fp32 one."""
    kind = master_kind(group)
    form = MASTER_KINDS[kind]["key"] if kind else MASTER
    if form in state:
        return
    master = master_of(p, state)
    for key in MASTER_KEYS:
        state.pop(key, None)
    if kind in _SPLIT:
        if master is None:
            state[form] = torch.zeros_like(p, dtype=getattr(torch, MASTER_KINDS[kind]["dtype"]),
                                           memory_format=torch.preserve_format)
            return
        high, state[form] = _SPLIT[kind](master)
        p.detach().copy_(high)
    elif master is not None:
        state[MASTER] = master
    elif kind == "fp32" and p.dtype in (torch.float16, torch.bfloat16):
        state[MASTER] = p.detach().to(torch.float32, memory_format=torch.preserve_format)


# ---- 8-bit state: which params have it, and bringing a param's state to its group's form ----

def quantized(p: torch.Tensor, group) -> bool:
    """Whether p's state is codes: the group says uint8 or uint4 and p is not small (a DTensor by
    its whole size, so that every rank decides alike). 4-bit codes of a single element would
    read as 8-bit ones, so a param, or a rank's shard, of one element keeps fp32 state."""
    return (group["state_dtype"] in _quantize.CODE_DTYPES and p.numel() >= group["min_8bit_size"]
            and (group["state_dtype"] == torch.uint8 or local_shard(p).numel() > 1))


# A DTensor param (FSDP2) has its state quantized shard by shard: the blocks of a rank's codes
# are those of its local shard (no block spans two shards), 8-bit codes are DTensors placed as
# the param, 4-bit codes (1-D) and the absmax rows are the rank's own plain tensors (shards may
# differ in size).

def _absmax_shape(p: torch.Tensor, rows: int, state_dtype) -> Tuple[int, int]:
    return rows, _quantize.blocks_of(local_shard(p).numel(), _quantize.block_of(state_dtype))


def _quantize_states(values, p: torch.Tensor, signed, state_dtype):
    codes, absmax = _quantize.quantize_states([local_shard(v) for v in values], local_shard(p.detach()), signed,
                                              state_dtype)
    if DTensor is not None and isinstance(p, DTensor) and state_dtype == torch.uint8:
        codes = [DTensor.from_local(c, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
                 for c in codes]
    return codes, absmax


def _held_codes(codes: torch.Tensor, p: torch.Tensor):
    """The state_dtype of codes held for p: torch.uint4 where they are 4-bit (1-D, of p's local
    shard), torch.uint8 otherwise."""
    return torch.uint4 if _quantize.packed(codes, local_shard(p)) else torch.uint8


def _fp32_values(p, state, keys):
    """The fp32 value of each state in ``keys`` (codes dequantized with their absmax row; zeros
    where missing), dropping the codes' absmax."""
    absmax = state.pop(_quantize.ABSMAX, None)
    values = []
    for row, key in enumerate(keys):
        value = state.get(key)
        if value is None:
            values.append(torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format))
        elif value.dtype == torch.uint8:
            if absmax is None or row >= absmax.shape[0]:
                raise ValueError(f"state[{key!r}] holds codes but no absmax row for them")
            signed = key in SIGNED_STATES
            values.append(_on_locals(lambda c, q, a=absmax[row], s=signed: _quantize.dequantize(c, a, s, q),
                                     p, value, p.detach()))
        else:
            values.append(value.float())
    return values


def bring_state(name: str, p: torch.Tensor, group, state, keys, initial=None) -> None:
    """Create the moments ``keys`` a param's step needs, in its group's form: ``state_dtype``
    tensors shaped like p (zeros, or ``initial[key]``), or for 8- or 4-bit state uint8 codes with
    ``state["state_absmax"]`` (one row per key). State in another form (fp32 moments from a
    checkpoint, codes after a change of ``state_dtype`` or of ``amsgrad``) is converted; a float
    state in the other float dtype is refused, as before."""
    initial = initial or {}
    if keys and quantized(p, group):
        codes = [state.get(k) for k in keys]
        absmax = state.get(_quantize.ABSMAX)
        state_dtype = group["state_dtype"]
        if all(c is None for c in codes) and absmax is None:  # new: each state its initial value
            coded = [_quantize.constant_code(initial.get(k, 0), k in SIGNED_STATES, state_dtype) for k in keys]
            if state_dtype == torch.uint4:
                n = local_shard(p).numel()
                state.update({k: _quantize.codes4_full(code, n, p.device) for k, (code, _) in zip(keys, coded)})
            else:
                state.update({k: torch.full_like(p, code, dtype=torch.uint8, memory_format=torch.preserve_format)
                              for k, (code, _) in zip(keys, coded)})
            rows = torch.tensor([a for _, a in coded], dtype=torch.float32, device=p.device)
            state[_quantize.ABSMAX] = rows[:, None].expand(_absmax_shape(p, len(keys), state_dtype)).contiguous()
            return
        if (all(c is not None and c.dtype == torch.uint8 and _held_codes(c, p) == state_dtype for c in codes)
                and absmax is not None and absmax.shape == _absmax_shape(p, len(keys), state_dtype)):
            return
        values = _fp32_values(p, state, keys)
        new_codes, state[_quantize.ABSMAX] = _quantize_states(values, p, [k in SIGNED_STATES for k in keys],
                                                              state_dtype)
        state.update(zip(keys, new_codes))
        return
    state_dtype = torch.float32 if group["state_dtype"] in _quantize.CODE_DTYPES else group["state_dtype"]
    if _quantize.ABSMAX in state:  # codes left from 8- or 4-bit state: fp32 values again
        held = [k for k in keys if k in state]
        for key, value in zip(held, _fp32_values(p, state, held)):
            state[key] = value.to(state_dtype)
    for key in keys:
        value = state.get(key)
        if value is None:
            state[key] = torch.full_like(p, initial.get(key, 0), dtype=state_dtype,
                                         memory_format=torch.preserve_format)
        elif isinstance(value, torch.Tensor) and value.dtype != state_dtype:
            raise TypeError(f"{name}: state[{key!r}] of a param is {value.dtype} "
                            f"but its group's state_dtype is {group['state_dtype']}")


def unpacked_state(p: torch.Tensor, state, keys):
    """A copy of a param's state with codes as fp32 values (for ``state_dict``), or the
    state itself when it has none."""
    if _quantize.ABSMAX not in state:
        return state
    out = dict(state)
    held = [k for k in keys if k in out]
    for key, value in zip(held, _fp32_values(p, out, held)):
        out[key] = value
    return out
