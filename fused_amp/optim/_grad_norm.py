"""The global norm of the unscaled grads, for clipping inside the fused step.

One read of every grad gives the norm and the GradScaler's inf/NaN flags together
(``ops.grad_norm_``); the step then multiplies the grads by ``min(1, max_norm / (norm + 1e-6))``
on the device, in the same multiply as the inverse loss scale."""
import math
import operator
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch

from fused_amp import _C, ops

try:  # torch builds without distributed support lack it
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover
    DTensor = None

_LOCAL_TENSOR = operator.attrgetter("_local_tensor")
# the norm types the fused pass computes; others go through torch (clip_grad_norm_ only)
FUSED_NORM_TYPES = (1.0, 2.0, math.inf)
# group options that must agree across groups: one total norm clips the grads of all of them
CLIP_OPTIONS = ("max_grad_norm", "grad_norm_type")


def check_clip_options(max_grad_norm, grad_norm_type):
    if max_grad_norm is not None:
        if isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float)):
            raise TypeError(f"max_grad_norm must be a number or None, got {max_grad_norm!r}")
        if not 0.0 < max_grad_norm < math.inf:
            raise ValueError(f"Invalid max_grad_norm: {max_grad_norm} (a positive, finite number, "
                             "or None for no clipping)")
    if isinstance(grad_norm_type, bool) or not isinstance(grad_norm_type, (int, float)) \
            or float(grad_norm_type) not in FUSED_NORM_TYPES:
        raise ValueError(f"Invalid grad_norm_type: {grad_norm_type!r} (1.0, 2.0 or inf)")


def check_same_clip_options(name: str, groups) -> tuple:
    """(max_grad_norm, grad_norm_type) of the groups, which must agree: the grads of all groups
    are clipped by their one total norm."""
    first = groups[0]
    settings = (first["max_grad_norm"], first["grad_norm_type"])
    for index, group in enumerate(groups[1:], 1):
        for key, value in zip(CLIP_OPTIONS, settings):
            if group[key] != value:
                raise ValueError(f"{name}: {key} is {group[key]!r} in param group {index} and "
                                 f"{value!r} in group 0: the grads of all groups are clipped by "
                                 f"one total norm, so every group needs the same {key}")
    return settings


def local_grads(params):
    """(grads, specs, sharded, device, refs) of ``params``: each param's ``.grad`` as the fused ops
    take it (the local shard of a DTensor grad; None where there is none), the distinct specs of
    the DTensor grads (their meshes and placements: FSDP2's grads share a few), how many grads
    were DTensors, the device of the grads when all are dense and on one device (else None), and
    what to keep while ops run on the local shards (``fused_amp._C.hold_refs``; None without).

    One C pass (``fused_amp._C.local_grads``): in Python, reading a DTensor's ``.grad`` and then
    its local shard cost about a microsecond per param when the objects are cold, as they are at
    every step. torch.compile cannot trace it, and gets the same in Python."""
    if not torch.compiler.is_compiling():
        return _C.local_grads(params, DTensor)
    grads = [p.grad for p in params]
    dtensors = [g for g in grads if DTensor is not None and isinstance(g, DTensor)]
    specs = list({id(g._spec): g._spec for g in dtensors}.values())
    grads = [local_shard(g) for g in grads]
    present = [g for g in grads if g is not None]
    one_device = len({g.device for g in present}) == 1 and all(g.layout == torch.strided for g in present)
    return grads, specs, len(dtensors), present[0].device if one_device else None, None


class Gathered(NamedTuple):
    """The grads of an optimizer's params as one pass read them (``gather``): the params of all
    its groups in order, and ``local_grads`` of them."""
    params: list
    grads: list
    specs: list
    sharded: int
    device: Optional[torch.device]
    refs: Any


def gather(optimizer) -> Gathered:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return Gathered(params, *local_grads(params))


def _grads_per_device(name: str, gathered: Gathered) -> Tuple[Dict[torch.device, List[torch.Tensor]], list]:
    """The gathered grads that are there, per device, and the process groups over which their
    local norms add up."""
    grads = [g for g in gathered.grads if g is not None]
    for i, g in enumerate(grads):
        if g.is_sparse:
            raise ValueError(f"{name}: grad {i} is sparse; gradient clipping needs dense gradients")
    groups = _shard_groups(gathered.specs, gathered.sharded, len(grads))
    if gathered.device is not None:
        return {gathered.device: grads}, groups
    per_device: Dict[torch.device, List[torch.Tensor]] = {}
    for g in grads:
        per_device.setdefault(g.device, []).append(g)
    return per_device, groups


def _shard_groups(specs, sharded: int, count: int) -> list:
    """The process groups over which the local norms of DTensor grads (``sharded`` of ``count``
    grads, with ``specs``) add up: the mesh dims the grads are sharded on (FSDP2: its one dim;
    HSDP: the shard dim, not the replicate dim)."""
    if not sharded:
        return []
    if sharded != count:
        raise NotImplementedError("gradient clipping over a mix of DTensor and plain grads is not "
                                  "supported: the plain grads' share of the norm is ambiguous")
    # a mesh's or a placement's hash is a Python call: hash the few distinct objects only
    meshes = list({id(spec.mesh): spec.mesh for spec in specs}.values())
    if len(meshes) > 1:
        meshes = list(set(meshes))  # equal meshes may be distinct objects
    placements = set({id(spec.placements): spec.placements for spec in specs}.values())
    if any(p.is_partial() for placement in placements for p in placement):
        raise NotImplementedError("gradient clipping of DTensor grads with Partial placements "
                                  "is not supported (reduce the grads first)")
    shard_dims = {tuple(i for i, p in enumerate(placement) if p.is_shard()) for placement in placements}
    if len(meshes) > 1 or len(shard_dims) > 1:
        raise NotImplementedError("gradient clipping needs all DTensor grads on one mesh, sharded "
                                  "on the same mesh dims")
    return [meshes[0].get_group(dim) for dim in next(iter(shard_dims))]


def local_shard(t):
    """The local shard of a DTensor; any other tensor (or None) as it is. Taken as torch's own
    FSDP2 code takes it (``_local_tensor``), not through ``to_local()``: that is an autograd
    Function and a view per call, most of the host time of a step over many small shards, for
    kernels that run outside autograd anyway."""
    return t._local_tensor if DTensor is not None and isinstance(t, DTensor) else t


def local_shards(tensors) -> List:
    """``local_shard`` of each tensor, in one C-level pass where all are DTensors."""
    try:
        return list(map(_LOCAL_TENSOR, tensors))
    except AttributeError:  # plain tensors (or None) among them
        return list(map(local_shard, tensors))


def _combined_over(groups, found, norm, norm_type):
    """The flag and the norm of every rank's shards, in one all-reduce per process group: of
    (flag, maximum) with MAX for the inf-norm; of (flag, p-th power) with SUM otherwise, the flag
    then clamped to 1.0 (found_inf is 0 or 1, never a count)."""
    inf_norm = norm_type == math.inf
    additive = inf_norm or norm_type == 0.0  # maxima, or counts of nonzeros: combined as they are
    pair = torch.stack([found, norm if additive else norm.pow(norm_type)])
    for group in groups:
        torch.distributed.all_reduce(pair, op=torch.distributed.ReduceOp.MAX if inf_norm
                                     else torch.distributed.ReduceOp.SUM, group=group)
    found = pair[0].clamp(max=1.0)
    return found, pair[1] if additive else pair[1].pow(1.0 / norm_type)


def total_grad_norm(optimizer, norm_type: float, inv_scale: Optional[torch.Tensor],
                    gathered: Optional[Gathered] = None) -> Tuple[torch.Tensor, Dict[torch.device, torch.Tensor]]:
    """The total ``norm_type``-norm of the optimizer's grads (as ``gathered``, else read now)
    times ``inv_scale`` (None: the grads are unscaled already), as a 0-dim fp32 tensor on the
    first grad's device, and the inf/NaN flag of each device's grads (1.0 or 0.0). No host sync.
    With DTensor grads the local values are combined over the mesh dims they are sharded on, so
    every rank gets the same norm."""
    gathered = gathered or gather(optimizer)  # (its refs kept until the ops below have run)
    per_device, groups = _grads_per_device(type(optimizer).__name__, gathered)
    norm_type = float(norm_type)
    norms, found_infs = [], {}
    for device, device_grads in per_device.items():
        found = torch.zeros((), dtype=torch.float32, device=device)
        norm = torch.empty((), dtype=torch.float32, device=device)
        inv = None if inv_scale is None else inv_scale.to(device, non_blocking=True)
        if norm_type in FUSED_NORM_TYPES:
            ops.grad_norm_(device_grads, found, norm, inv, norm_type)
        else:  # torch's norm (a second read of the grads): only for other norm types
            ops.non_finite_check_(device_grads, found)
            norm.copy_(torch.nn.utils.get_total_norm(device_grads, norm_type))
            if inv is not None and norm_type != 0.0:  # a norm is homogeneous, except the count
                norm.mul_(inv)
        if groups:  # DTensor grads live on one device: combine flag and norm over the mesh
            found, norm = _combined_over(groups, found, norm, norm_type)
        norms.append(norm)
        found_infs[device] = found
    if not norms:
        return torch.zeros((), dtype=torch.float32), found_infs
    if len(norms) == 1:
        return norms[0], found_infs
    first = norms[0].device
    return torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), norm_type), found_infs
