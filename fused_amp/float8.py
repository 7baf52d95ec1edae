"""fp8 weights that the optimizer's step writes: e4m3 copies with delayed scaling, and MXFP8
copies (e4m3 blocks of 32, each with its own power-of-two scale).

A recipe that feeds fp8 weights to its matmuls (TransformerEngine's fp8 weights, or a model
calling ``torch._scaled_mm``) casts each weight to fp8: torchao and TE recast it in every
forward, or in a pass of its own after the step. With delayed scaling the scale of the next cast
is known before the step (it comes from the amax history), so fused_amp's step writes each copy
in the pass that writes the weight, and records the weight's amax for the history there too. An
MX block's scale depends on that block alone, so the step forms it from the block it has just
written, and casts the block by it, in the same pass.
"""
from typing import Dict, Iterable, List, Tuple

import torch

from fused_amp import ops
from fused_amp.optim._base import MasterWeightOptimizer

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch built without distributed
    DTensor = ()

E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448


def _cast(p: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """torchao's cast of a weight (``hp_tensor_and_scale_to_float8``, saturated)."""
    return (p.detach().float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


class Float8Weights:
    r"""e4m3 copies of ``params`` that each step of ``optimizer`` writes, with delayed scaling.

    After each step, every copy is its param as the step wrote it, times its scale, clamped to
    the e4m3 range and cast to nearest even: bit for bit torchao's cast of the weight,
    ``(p.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn)``, and for an fp32 param
    TransformerEngine's cast of the master. :meth:`weight` gives a copy with the inverse of the
    scale it was cast with, as ``torch._scaled_mm`` takes it.

    The scales follow TransformerEngine's ``DelayedScaling`` recipe: each step writes each
    param's amax (``max(abs(p))`` of what it wrote) into row 0 of its amax history; after the
    step, :func:`fused_amp.ops.delayed_scale_update_` rolls the histories and sets the scale of
    the next cast, :math:`448 \cdot 2^{-\mathrm{margin}} / a`, with :math:`a` the history's
    largest amax (``amax_compute_algo="max"``) or the newest (``"most_recent"``). A step skipped
    for inf/NaN grads writes nothing and records no amax, so no history or scale moves. The
    copies start as the cast of the params with the scale their amax gives.

    Args:
        optimizer: a ``fused_amp.optim`` optimizer (not Muon) that holds ``params``.
        params: the params to keep copies of, all on one device, not sharded (DTensor).
        amax_history_len: the amax history's length (default: 1024, TE's).
        amax_compute_algo: ``"max"`` (default) or ``"most_recent"``.
        margin: the scaled amax lands at :math:`448 \cdot 2^{-\mathrm{margin}}` (default: 0).

    Example::

        copies = fused_amp.float8.Float8Weights(optimizer, [m.weight for m in linears])
        ...  # in a linear's forward:
        w8, w_scale_inv = copies.weight(self.weight)
        y = torch._scaled_mm(x8, w8.t(), scale_a=x_scale_inv, scale_b=w_scale_inv,
                             out_dtype=torch.bfloat16)
    """

    def __init__(self, optimizer, params: Iterable[torch.Tensor], *, amax_history_len: int = 1024,
                 amax_compute_algo: str = "max", margin: float = 0.0):
        self.params: List[torch.Tensor] = list(params)
        _check("Float8Weights", optimizer, self.params)
        if amax_history_len < 1:
            raise ValueError(f"Float8Weights: amax_history_len must be at least 1, got {amax_history_len}")
        if amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"Float8Weights: amax_compute_algo must be 'max' or 'most_recent', got "
                             f"{amax_compute_algo!r}")
        device = self.params[0].device
        n = len(self.params)
        self.amax_compute_algo = amax_compute_algo
        self.margin = float(margin)
        self.amax_history = torch.zeros(amax_history_len, n, device=device)
        self.scale = torch.ones(n, device=device)
        # the copies' dequantization scales (written by the step, as of each cast); the update
        # writes the next scales' inverses into its own buffer
        self.scale_inv = torch.ones(n, device=device)
        self._next_scale_inv = torch.ones(n, device=device)
        self._index: Dict[int, int] = {id(p): i for i, p in enumerate(self.params)}
        with torch.no_grad():
            self.amax_history[0] = torch.stack([p.detach().abs().max().float() if p.numel() else
                                                torch.zeros((), device=device) for p in self.params])
            self.update()
            self.data: List[torch.Tensor] = [_cast(p, self.scale[i]) for i, p in enumerate(self.params)]
            torch.reciprocal(self.scale, out=self.scale_inv)
        optimizer._attached.float8_copies.append(self)
        optimizer._lists.forget()

    def weight(self, param: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``param``'s e4m3 copy and its dequantization scale (a 0-d fp32 tensor, ``1 / scale``
        of its cast): the copy times it is the param, to fp8's precision."""
        i = self._index.get(id(param))
        if i is None:
            raise KeyError("Float8Weights.weight: param is not one of the params these copies were made for")
        return self.data[i], self.scale_inv[i]

    def _step_tensors(self, i: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Copy i's entries of ops.step_'s float8 lists: its codes, scale and the scale's inverse."""
        return self.data[i], self.scale[i:i + 1], self.scale_inv[i:i + 1]

    @torch.no_grad()
    def update(self) -> None:
        """The delayed scaling update, which the optimizer runs after each step."""
        ops.delayed_scale_update_([self.amax_history], [self.scale], [self._next_scale_inv], fp8_max=E4M3_MAX,
                                  margin=self.margin, amax_compute_algo=self.amax_compute_algo)

    def state_dict(self) -> dict:
        """The copies, their scales and the amax history, for a checkpoint."""
        return dict(data=list(self.data), amax_history=self.amax_history, scale=self.scale,
                    scale_inv=self.scale_inv)

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        if len(state["data"]) != len(self.params) or state["amax_history"].shape != self.amax_history.shape:
            raise ValueError(f"Float8Weights.load_state_dict: the state holds {len(state['data'])} copies and a "
                             f"history of shape {tuple(state['amax_history'].shape)}; these copies are "
                             f"{len(self.params)}, with a history of shape {tuple(self.amax_history.shape)}")
        for mine, saved in zip(self.data, state["data"]):
            mine.copy_(saved)
        for key in ("amax_history", "scale", "scale_inv"):
            getattr(self, key).copy_(state[key])


MX_BLOCK = 32


def _mx_cast(p: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """torchao's ``to_mx(p, torch.float8_e4m3fn, 32)`` (FLOOR): the e4m3 codes and the e8m0 scales."""
    x = p.detach().float().reshape(*p.shape[:-1], -1, MX_BLOCK)
    amax = x.abs().amax(-1, keepdim=True)
    code = ((amax.view(torch.int32) >> 23) - 8).clamp(min=0)  # the amax's power of two over e4m3's largest, 2^8
    code = torch.where(amax.isnan(), 255, code)
    scale = (code << 23).view(torch.float32).clamp(min=2.0 ** -126)
    data = (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).reshape(p.shape).clone()
    # (tensors of their own, not views of this function's temporaries: the step writes them)
    scales = torch.empty(code.shape[:-1], dtype=torch.float8_e8m0fnu, device=p.device)
    scales.view(torch.uint8).copy_(code.squeeze(-1))
    return data, scales


class MXWeights:
    r"""MXFP8 copies of ``params`` that each step of ``optimizer`` writes: e4m3 elements in
    blocks of 32 along the last dim, each block with its own scale (OCP microscaling).

    After each step, every copy is its param as the step wrote it, cast as torchao's
    ``to_mx(p, torch.float8_e4m3fn, 32)`` casts it, bit for bit: each block's scale is
    :math:`2^{\lfloor \log_2 a \rfloor - 8}` for the block's amax :math:`a` (torchao's default
    FLOOR mode; 8 is the exponent of e4m3's largest value, 448), stored as an e8m0 code; the block
    is divided by it, clamped to the e4m3 range and cast to nearest even. A block's scale needs
    only that block, so the step forms it in the pass that writes the weight: there is no
    history and no update. A step skipped for inf/NaN grads writes nothing. :meth:`weight` gives
    a copy's codes and scales, as torchao's ``MXTensor`` holds them (``qdata``, ``scale``).

    Args:
        optimizer: a ``fused_amp.optim`` optimizer (not Muon) that holds ``params``.
        params: the params to keep copies of, all on one device, not sharded (DTensor), each
            contiguous, its last dim a multiple of 32.

    Example::

        copies = fused_amp.float8.MXWeights(optimizer, [m.weight for m in linears])
        ...  # in a linear's forward:
        codes, scales = copies.weight(self.weight)  # (out, in) e4m3, (out, in // 32) e8m0
    """

    def __init__(self, optimizer, params: Iterable[torch.Tensor]):
        self.params: List[torch.Tensor] = list(params)
        _check("MXWeights", optimizer, self.params)
        for i, p in enumerate(self.params):
            if p.dim() == 0 or p.shape[-1] % MX_BLOCK or not p.is_contiguous():
                raise ValueError(f"MXWeights: params[{i}] (shape {tuple(p.shape)}) must be contiguous with a last "
                                 f"dim that is a multiple of {MX_BLOCK}: its blocks of {MX_BLOCK} run along it")
        self._index: Dict[int, int] = {id(p): i for i, p in enumerate(self.params)}
        with torch.no_grad():
            casts = [_mx_cast(p) for p in self.params]
        self.data: List[torch.Tensor] = [data for data, _ in casts]
        self.scales: List[torch.Tensor] = [scales for _, scales in casts]
        self._no_inverse = torch.empty(0, device=self.params[0].device)  # (an MX block scale is its own)
        optimizer._attached.float8_copies.append(self)
        optimizer._lists.forget()

    def weight(self, param: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        r"""``param``'s e4m3 codes and its e8m0 block scales (shaped as the param, with the last
        dim divided by 32): block :math:`b` of the codes times :math:`2^{\mathrm{scales}[b] - 127}`
        is the block of the param, to MXFP8's precision."""
        i = self._index.get(id(param))
        if i is None:
            raise KeyError("MXWeights.weight: param is not one of the params these copies were made for")
        return self.data[i], self.scales[i]

    def _step_tensors(self, i: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Copy i's entries of ops.step_'s float8 lists: its codes, block scales (their bytes, which
        torch.compile can trace the step writing) and no inverse."""
        return self.data[i], self.scales[i].view(torch.uint8), self._no_inverse

    def state_dict(self) -> dict:
        """The copies and their scales, for a checkpoint."""
        return dict(data=list(self.data), scales=list(self.scales))

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        if len(state["data"]) != len(self.params):
            raise ValueError(f"MXWeights.load_state_dict: the state holds {len(state['data'])} copies; these "
                             f"copies are {len(self.params)}")
        for mine, saved in zip(self.data + self.scales, state["data"] + state["scales"]):
            mine.copy_(saved)


def _check(name: str, optimizer, params) -> None:
    if not params:
        raise ValueError(f"{name}: params is empty")
    if not isinstance(optimizer, MasterWeightOptimizer):
        raise TypeError(f"{name}: optimizer must be a fused_amp.optim optimizer, got {type(optimizer).__name__}")
    if type(optimizer).__name__ == "Muon":
        raise ValueError(f"{name}: Muon writes its 2-D params in a pass of its own, which writes no fp8 copy")
    if optimizer._attached.in_backward is not None:
        raise ValueError(f"{name}: the optimizer steps in backward (step_in_backward), a bucket at a time, and "
                         "those steps write no fp8 copies")
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    taken = {id(p) for other in optimizer._attached.float8_copies for p in other.params}
    for i, p in enumerate(params):
        if id(p) not in held:
            raise ValueError(f"{name}: params[{i}] is not a param of the optimizer")
        if id(p) in taken:
            raise ValueError(f"{name}: params[{i}] already has fp8 copies for this optimizer")
        if isinstance(p, DTensor):
            raise ValueError(f"{name}: params[{i}] is a DTensor (sharded); its amax would need a reduction over "
                             "the mesh, which these copies do not make")
        if p.device != params[0].device:
            raise ValueError(f"{name}: params[{i}] is on {p.device} but params[0] is on {params[0].device}")
