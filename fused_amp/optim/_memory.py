"""The memory modes: where the fp32 value of a half param lives (``master_weights``) and the
dtype of the optimizer state (``state_dtype``, with optional stochastic rounding)."""
from typing import Optional, Tuple

import torch

from fused_amp.optim._grad_norm import DTensor, local_shard

MASTER = "master_param"        # fp32 master (master_weights=True or "fp32")
REMAINDER = "master_remainder"  # int16 low half of the master of a bf16 param ("remainder")
MASTER_WEIGHTS = (True, False, "fp32", "remainder")
STATE_DTYPES = (torch.float32, torch.bfloat16)
# how the optimizer stores its state, which a loaded checkpoint does not change
MEMORY_OPTIONS = ("master_weights", "state_dtype", "stochastic_rounding")


def master_kind(group) -> Optional[str]:
    """None (params updated in place), "fp32" or "remainder", from a group's master_weights."""
    mw = group["master_weights"]
    return "remainder" if mw == "remainder" else ("fp32" if mw else None)


def check_memory_options(name: str, master_weights, state_dtype, stochastic_rounding,
                         rounding_seed) -> int:
    """Refuse what the memory options cannot be; returns the rounding seed to keep: when not
    given, the seed of torch's default generator (``torch.manual_seed`` decides it; nothing is
    drawn from the generator, so building an optimizer leaves the random stream as it was)."""
    if isinstance(master_weights, str) and master_weights not in MASTER_WEIGHTS:
        raise ValueError(f"{name}: master_weights must be True, False, 'fp32' or 'remainder', "
                         f"got {master_weights!r}")
    if not isinstance(master_weights, (bool, str)):
        raise TypeError(f"{name}: master_weights must be True, False, 'fp32' or 'remainder', "
                        f"got {type(master_weights).__name__}")
    if state_dtype not in STATE_DTYPES:
        raise ValueError(f"{name}: state_dtype must be torch.float32 or torch.bfloat16, got {state_dtype}")
    if stochastic_rounding and state_dtype != torch.bfloat16:
        raise ValueError(f"{name}: stochastic_rounding=True rounds bf16 state; it needs "
                         f"state_dtype=torch.bfloat16, got {state_dtype}")
    if rounding_seed is None:
        return torch.initial_seed() % 2**63
    if isinstance(rounding_seed, bool) or not isinstance(rounding_seed, int):
        raise TypeError(f"{name}: rounding_seed must be an int or None, got {type(rounding_seed).__name__}")
    return rounding_seed


def check_group_params(name: str, group, index: int):
    """master_weights="remainder" keeps the master in a bf16 param's low half: bf16 params only."""
    if master_kind(group) != "remainder":
        return
    for i, p in enumerate(group["params"]):
        if p.dtype != torch.bfloat16:
            raise ValueError(f"{name}: master_weights='remainder' needs bfloat16 params (the master is "
                             f"the param plus a 16-bit remainder); param {i} of group {index} is {p.dtype}")


def rounding_seed_of(group) -> Optional[int]:
    """The seed the fused op takes: set only when bf16 state rounds stochastically."""
    if group["stochastic_rounding"] and group["state_dtype"] == torch.bfloat16:
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
