"""Blockwise optimizer state on the Python side, 8-bit (``state_dtype=torch.uint8``) and 4-bit
(``torch.uint4``): the same codes as the kernels (csrc/ops/quantize.h, csrc/ops/quantize4.h), bit
for bit, for checkpoints and for state that arrives in fp32 (a loaded checkpoint, a change of
state_dtype).

A state's blocks are runs of ``QUANT_BLOCK`` (8-bit) or ``QUANT4_BLOCK`` (4-bit) elements in
the param's memory order, each with one fp32 absmax, kept for all of a param's states in
``state["state_absmax"]`` (one row per state, in the optimizer's state order). 8-bit codes have
the param's shape and layout; 4-bit codes are a 1-D uint8 tensor of two codes per byte (element
2i in the high half), which is how the kernels tell them apart (``packed``).
"""
import struct
from typing import Sequence, Tuple

import torch

from fused_amp import ops

ABSMAX = "state_absmax"
# the state_dtype values held as codes and their blocks, from the storage kinds' table
# (csrc/storage_kinds.h): 256 for 8-bit codes, 128 (torchao's AdamW4bit's) for 4-bit ones
_BLOCKS = {getattr(torch, kind["option"]): kind["block"] for kind in ops.storage_kinds()["states"] if kind["block"]}
CODE_DTYPES = tuple(_BLOCKS)
QUANT_BLOCK = _BLOCKS[torch.uint8]
QUANT4_BLOCK = _BLOCKS[torch.uint4]
MIN_8BIT_SIZE = 4096  # params with fewer elements keep fp32 state (bitsandbytes' and torchao's default too)
# the 4-bit maps (csrc/ops/quantize4.h): torchao's create_dynamic_map(True, 3, 4) as fp32, and
# 1/16, ..., 1
_SIGNED4 = [float.fromhex(h) for h in (
    "-0x1.c66666p-1", "-0x1.533334p-1", "-0x1.cp-2", "-0x1.b33332p-3", "-0x1.3d70a4p-4", "-0x1.0a3d72p-5",
    "-0x1.6872b0p-8", "0x0p0", "0x1.6872b0p-8", "0x1.0a3d72p-5", "0x1.3d70a4p-4", "0x1.b33332p-3", "0x1.cp-2",
    "0x1.533334p-1", "0x1.c66666p-1", "0x1p0")]
_UNSIGNED4 = [(c + 1) / 16 for c in range(16)]


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


# each map's midpoints of neighbouring entries, as the kernels compute them: the fp32 sum halved
_MIDS4 = {signed: [_f32((e[c] + e[c + 1]) * 0.5) for c in range(15)]
          for signed, e in ((True, _SIGNED4), (False, _UNSIGNED4))}
_ZERO4 = {True: 7, False: 0}  # the code a block below FLT_MIN keeps: the signed map's 0, the unsigned map's lowest
_SIGNED_LEVELS = 127.0
_UNSIGNED_LEVELS = 255.0
_FLT_MIN = torch.finfo(torch.float32).tiny
_FLT_MAX = torch.finfo(torch.float32).max


def blocks_of(numel: int, block: int = QUANT_BLOCK) -> int:
    return -(-numel // block)


def block_of(state_dtype) -> int:
    """The elements per absmax of a state_dtype held as codes."""
    return _BLOCKS[state_dtype]


def packed(codes: torch.Tensor, like: torch.Tensor) -> bool:
    """Whether ``codes`` (uint8) are 4-bit codes of ``like``'s elements: a 1-D tensor of half its
    elements (rounded up), not shaped as ``like`` (csrc/core/storage_dtypes.h)."""
    return codes.shape != like.shape and codes.dim() == 1 and codes.numel() == (like.numel() + 1) // 2


def _memory_order(t: torch.Tensor) -> torch.Tensor:
    """A flat view of a dense tensor's elements in memory order."""
    return t.as_strided((t.numel(),), (1,), t.storage_offset())


def _blocks(flat: torch.Tensor, block: int = QUANT_BLOCK) -> torch.Tensor:
    pad = (-flat.numel()) % block
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return flat.view(-1, block)


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded fp32 square root, as the kernels' (torch's own CPU sqrt can be an
    ulp off); float64 has the precision for the double rounding to be exact."""
    return x.double().sqrt().float()


def dequantize(codes: torch.Tensor, absmax: torch.Tensor, signed: bool, like=None) -> torch.Tensor:
    """The fp32 values of ``codes`` (uint8, dense) with their blocks' ``absmax``, shaped and laid
    out as ``codes``, or for 4-bit codes as ``like`` (the param)."""
    if like is not None and packed(codes, like):
        return _dequantize4(codes, absmax, signed, like)
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


def quantize(values: torch.Tensor, like: torch.Tensor, signed: bool, state_dtype=torch.uint8):
    """(codes, absmax) of fp32 ``values`` in the layout of ``like`` (the param), rounded to the
    nearest code with each block's absmax, as the kernels store them; 4-bit codes with
    ``state_dtype=torch.uint4``."""
    if state_dtype == torch.uint4:
        return _quantize4(values, like, signed)
    staged = _staged(values, like)
    x = _blocks(_memory_order(staged))
    absmax, coded, inv = _absmax_and_inverse(x)
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


def _staged(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """fp32 ``values`` dense, in the param's layout (a param that is not dense gets contiguous
    state): the order in which the kernels walk the param."""
    staged = torch.empty_like(like, dtype=torch.float32, memory_format=torch.preserve_format)
    staged.copy_(values)
    return staged


def _dequantize4(codes: torch.Tensor, absmax: torch.Tensor, signed: bool, like: torch.Tensor) -> torch.Tensor:
    n = like.numel()
    c = torch.stack([codes >> 4, codes & 15], dim=-1).reshape(-1)[:n].long()
    entries = torch.tensor(_SIGNED4 if signed else _UNSIGNED4, dtype=torch.float32, device=codes.device)
    # each code's entry times its block's absmax, the kernels' one product
    values = _blocks(entries[c], QUANT4_BLOCK) * absmax.reshape(-1, 1).to(torch.float32)
    out = torch.empty_like(like, dtype=torch.float32, memory_format=torch.preserve_format)
    _memory_order(out).copy_(values.reshape(-1)[:n])
    return out


def _absmax_and_inverse(x: torch.Tensor):
    """Each block's absmax (NaN where it holds a NaN), whether it is coded (finite, >= FLT_MIN),
    and 1 / absmax where it is (0 elsewhere)."""
    nan = x.isnan().any(1, keepdim=True)
    absmax = torch.where(nan, torch.full_like(x[:, :1], float("nan")), x.abs().amax(1, keepdim=True))
    coded = (absmax >= _FLT_MIN) & (absmax <= _FLT_MAX)
    inv = torch.where(coded, 1.0 / torch.where(coded, absmax, torch.ones_like(absmax)), torch.zeros_like(absmax))
    return absmax, coded, inv


def _quantize4(values: torch.Tensor, like: torch.Tensor, signed: bool):
    """(codes, absmax) of fp32 ``values`` as 4-bit codes of ``like``'s elements: each unit
    x * (1 / absmax) to the entry whose midpoints with its neighbours bracket it."""
    staged = _staged(values, like)
    n = staged.numel()
    x = _blocks(_memory_order(staged), QUANT4_BLOCK)
    absmax, coded, inv = _absmax_and_inverse(x)
    mids = torch.tensor(_MIDS4[signed], dtype=torch.float32, device=x.device)
    unit = x * inv
    c = (unit.unsqueeze(-1) >= mids).sum(-1)
    c = torch.where(coded, c, torch.full_like(c, _ZERO4[signed])).reshape(-1)[:n]
    if n % 2:
        c = torch.cat([c, c.new_zeros(1)])
    codes = ((c[0::2] << 4) | c[1::2]).to(torch.uint8)
    stored = torch.where(absmax < _FLT_MIN, torch.zeros_like(absmax),
                         torch.where(coded, absmax, torch.full_like(absmax, float("nan"))))
    return codes, stored.reshape(-1)


def constant_code(value: float, signed: bool, state_dtype=torch.uint8) -> Tuple[int, float]:
    """(code, block absmax) of a state whose every element is ``value`` (its initial value: zero,
    Adagrad's ``initial_accumulator_value``, Rprop's ``lr``), as :func:`quantize` gives them, from
    Python numbers: a first step that torch.compile traces creates the state without a graph
    break. Unsigned states are never negative. For 4-bit codes the code is a byte's, both halves
    (an odd element count's last byte keeps 0 in its low half: ``codes4_full``)."""
    v = _f32(value)
    a = abs(v)
    if state_dtype == torch.uint4:
        if not _FLT_MIN <= a <= _FLT_MAX:  # zero, or inf or NaN: the zero code, absmax 0 or NaN
            return _ZERO4[signed] * 17, (0.0 if a < _FLT_MIN else float("nan"))
        unit = _f32(v * _f32(1.0 / a))  # (exact products of fp32 in double, rounded once)
        code = sum(unit >= mid for mid in _MIDS4[signed])
        return code * 17, a
    if a < _FLT_MIN:  # zero (or an fp32 denormal): absmax 0, code 0
        return 0, 0.0
    if not a <= _FLT_MAX:  # inf or NaN: not coded, the absmax says what it was
        return 0, a
    # every element is the absmax: the top code (a negative signed one as int8 bits)
    return (int(_SIGNED_LEVELS) if v > 0 else 256 - int(_SIGNED_LEVELS)) if signed else int(_UNSIGNED_LEVELS), a


def codes4_full(byte: int, numel: int, device) -> torch.Tensor:
    """4-bit codes of ``numel`` elements that all hold the code pair ``byte`` (constant_code)."""
    codes = torch.full(((numel + 1) // 2,), byte, dtype=torch.uint8, device=device)
    if numel % 2:
        codes[-1] = byte & 0xF0
    return codes


def quantize_states(values: Sequence[torch.Tensor], like: torch.Tensor, signed: Sequence[bool],
                    state_dtype=torch.uint8):
    """Codes of each state and their absmax rows stacked as ``state["state_absmax"]``."""
    out = [quantize(v, like, s, state_dtype) for v, s in zip(values, signed)]
    return [c for c, _ in out], torch.stack([a for _, a in out])
