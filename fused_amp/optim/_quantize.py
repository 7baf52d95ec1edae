"""8-bit blockwise optimizer state (``state_dtype=torch.uint8``) on the Python side: the same
codes as the kernels (csrc/ops/quantize.h), bit for bit, for checkpoints and for state that
arrives in fp32 (a loaded checkpoint, a change of state_dtype).

A state tensor's codes have the param's shape and layout; its blocks are runs of
``QUANT_BLOCK`` elements in their memory order, each with one fp32 absmax, kept for all of a
param's states in ``state["state_absmax"]`` (one row per state, in the optimizer's state order).
"""
import struct
from typing import Sequence, Tuple

import torch

ABSMAX = "state_absmax"
QUANT_BLOCK = 256
MIN_8BIT_SIZE = 4096  # params with fewer elements keep fp32 state (bitsandbytes' default too)
_SIGNED_LEVELS = 127.0
_UNSIGNED_LEVELS = 255.0
_FLT_MIN = torch.finfo(torch.float32).tiny
_FLT_MAX = torch.finfo(torch.float32).max


def blocks_of(numel: int) -> int:
    return -(-numel // QUANT_BLOCK)


def _memory_order(t: torch.Tensor) -> torch.Tensor:
    """A flat view of a dense tensor's elements in memory order."""
    return t.as_strided((t.numel(),), (1,), t.storage_offset())


def _blocks(flat: torch.Tensor) -> torch.Tensor:
    pad = (-flat.numel()) % QUANT_BLOCK
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return flat.view(-1, QUANT_BLOCK)


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded fp32 square root, as the kernels' (torch's own CPU sqrt can be an
    ulp off); float64 has the precision for the double rounding to be exact."""
    return x.double().sqrt().float()


def dequantize(codes: torch.Tensor, absmax: torch.Tensor, signed: bool) -> torch.Tensor:
    """The fp32 values of ``codes`` (uint8, dense) with their blocks' ``absmax``, shaped and laid
    out as ``codes``."""
    n = codes.numel()
    flat = _memory_order(codes)
    c = (flat.view(torch.int8) if signed else flat).to(torch.float32)
    c = _blocks(c)
    a = absmax.reshape(-1, 1).to(torch.float32)
    # the top code gives the absmax itself (csrc/ops/quantize.h)
    if signed:
        values = torch.where(c.abs() == _SIGNED_LEVELS, torch.copysign(a.expand_as(c), c),
                             c * c.abs() * (a / (_SIGNED_LEVELS * _SIGNED_LEVELS)))
    else:
        values = torch.where(c == _UNSIGNED_LEVELS, a.expand_as(c), c * c * (a / (_UNSIGNED_LEVELS ** 2)))
    out = torch.empty_like(codes, dtype=torch.float32)
    _memory_order(out).copy_(values.reshape(-1)[:n])
    return out


def quantize(values: torch.Tensor, like: torch.Tensor, signed: bool):
    """(codes, absmax) of fp32 ``values`` in the layout of ``like`` (the param), rounded to the
    nearest code with each block's absmax, as the kernels store them."""
    # dense, in the param's layout (a param that is not dense gets contiguous state)
    staged = torch.empty_like(like, dtype=torch.float32, memory_format=torch.preserve_format)
    staged.copy_(values)
    x = _blocks(_memory_order(staged))
    nan = x.isnan().any(1, keepdim=True)
    absmax = torch.where(nan, torch.full_like(x[:, :1], float("nan")), x.abs().amax(1, keepdim=True))
    coded = (absmax >= _FLT_MIN) & (absmax <= _FLT_MAX)
    inv = torch.where(coded, 1.0 / torch.where(coded, absmax, torch.ones_like(absmax)), torch.zeros_like(absmax))
    if signed:
        unit = torch.minimum(x.abs() * inv, torch.ones_like(x))
        c = torch.copysign(torch.round(_sqrt(unit) * _SIGNED_LEVELS), x)
    else:
        unit = torch.minimum(x * inv, torch.ones_like(x))
        c = torch.maximum(torch.round(_sqrt(unit) * _UNSIGNED_LEVELS), (x > 0).to(torch.float32))
    c = torch.where(coded, c, torch.zeros_like(c))
    codes = torch.empty_like(like, dtype=torch.uint8, memory_format=torch.preserve_format)
    _memory_order(codes).copy_(c.to(torch.int32).reshape(-1)[:staged.numel()].to(torch.uint8))
    stored = torch.where(absmax < _FLT_MIN, torch.zeros_like(absmax), absmax)
    return codes, stored.reshape(-1)


def constant_code(value: float, signed: bool) -> Tuple[int, float]:
    """(code, block absmax) of a state whose every element is ``value`` (its initial value: zero,
    Adagrad's ``initial_accumulator_value``, Rprop's ``lr``), as :func:`quantize` gives them, from
    Python numbers: a first step that torch.compile traces creates the state without a graph
    break. Unsigned states are never negative."""
    v = struct.unpack("f", struct.pack("f", value))[0]  # the fp32 value
    a = abs(v)
    if a < _FLT_MIN:  # zero (or an fp32 denormal): absmax 0, code 0
        return 0, 0.0
    if not a <= _FLT_MAX:  # inf or NaN: not coded, the absmax says what it was
        return 0, a
    # every element is the absmax: the top code (a negative signed one as int8 bits)
    return (int(_SIGNED_LEVELS) if v > 0 else 256 - int(_SIGNED_LEVELS)) if signed else int(_UNSIGNED_LEVELS), a


def quantize_states(values: Sequence[torch.Tensor], like: torch.Tensor, signed: Sequence[bool]):
    """Codes of each state and their absmax rows stacked as ``state["state_absmax"]``."""
    out = [quantize(v, like, s) for v, s in zip(values, signed)]
    return [c for c, _ in out], torch.stack([a for _, a in out])
