"""The global norm of the unscaled grads, for clipping inside the fused step.

One read of every grad gives the norm and the GradScaler's inf/NaN flags together
(``ops.grad_norm_``); the step then multiplies the grads by ``min(1, max_norm / (norm + 1e-6))``
on the device, in the same multiply as the inverse loss scale."""
import math
import operator
from itertools import chain
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch

import fused_amp._C as _C  # the extension module itself, not the package face
from fused_amp import ops
from fused_amp.optim import _placements
from fused_amp.optim._stages import stage_groups

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
    """(grads, specs, sharded, device, refs, spec_of) of ``params``: each param's ``.grad`` as the
    fused ops take it (the local shard of a DTensor grad; None where there is none), the distinct
    specs of the DTensor grads (their meshes and placements: FSDP2's grads share a few), how many
    grads were DTensors, the device of the grads when all are dense and on one device (else None),
    what to keep while ops run on the local shards (``fused_amp._C.hold_refs``; None without), and
    each grad's index in ``specs`` (None for a plain grad or none).

    One C pass (``fused_amp._C.local_grads``): in Python, reading a DTensor's ``.grad`` and then
    its local shard cost about a microsecond per param when the objects are cold, as they are at
    every step. torch.compile cannot trace it, and gets the same in Python."""
    if not torch.compiler.is_compiling():
        return _C.local_grads(params, DTensor)
    grads = [p.grad for p in params]
    dtensors = [g for g in grads if DTensor is not None and isinstance(g, DTensor)]
    index = {}
    for g in dtensors:
        index.setdefault(id(g._spec), (len(index), g._spec))
    spec_of = [index[id(g._spec)][0] if DTensor is not None and isinstance(g, DTensor) else None for g in grads]
    grads = [local_shard(g) for g in grads]
    present = [g for g in grads if g is not None]
    one_device = len({g.device for g in present}) == 1 and all(g.layout == torch.strided for g in present)
    return (grads, [spec for _, spec in index.values()], len(dtensors),
            present[0].device if one_device else None, None, spec_of)


class Gathered(NamedTuple):
    """The grads of an optimizer's params as one pass read them (``gather``): the params of all
    its groups in order, and ``local_grads`` of them."""
    params: list
    grads: list
    specs: list
    sharded: int
    device: Optional[torch.device]
    refs: Any
    spec_of: List[Optional[int]]  # each grad's index in specs


def gather(optimizer) -> Gathered:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return Gathered(params, *local_grads(params))


class _MeshPart(NamedTuple):
    """The DTensor grads on one mesh whose local p-th powers add up over the same mesh dims,
    and whether this rank's share counts (it is the first of the ranks holding the same values
    along every reduced dim the grads are replicated on)."""
    indices: Optional[List[int]]  # into the present grads; None: all of them
    counts_here: bool


class _MeshPlan(NamedTuple):
    """What one mesh's grads reduce over: the mesh dims sharding any of them, and the parts."""
    mesh: Any
    dims: Tuple[int, ...]
    parts: List[_MeshPart]


def _grads_per_device(name: str, gathered: Gathered):
    """The gathered grads that are there, per device, and how their local norms combine over
    the meshes of DTensor grads (None for plain grads)."""
    present = [i for i, g in enumerate(gathered.grads) if g is not None]
    grads = [gathered.grads[i] for i in present]
    for i, g in enumerate(grads):
        if g.is_sparse:
            raise ValueError(f"{name}: grad {i} is sparse; gradient clipping needs dense gradients")
    plans = _mesh_plans(gathered, present)
    if gathered.device is not None:
        return {gathered.device: grads}, plans
    if plans is not None:
        raise NotImplementedError(f"{name}: gradient clipping of DTensor grads on several devices is not supported")
    per_device: Dict[torch.device, List[torch.Tensor]] = {}
    for g in grads:
        per_device.setdefault(g.device, []).append(g)
    return per_device, plans


def _mesh_plans(gathered: Gathered, present: List[int]) -> Optional[List[_MeshPlan]]:
    """How the local norms of DTensor grads add up to the global one: per mesh (in the order the
    params first use it, the same on every rank), the mesh dims any grad is sharded on, over which
    one all-reduce per dim sums the ranks' shares; a grad replicated along one of those dims counts
    on the first rank along it only. Grads on several meshes (TP submeshes) each reduce over their
    own; grads with other placements on one mesh (TP + FSDP2: Shard and _StridedShard on both dims,
    a row-parallel bias replicated over tp) are grouped by the dims they are sharded on."""
    if not gathered.sharded:
        return None
    if gathered.sharded != len(present):
        raise NotImplementedError("gradient clipping over a mix of DTensor and plain grads is not "
                                  "supported: the plain grads' share of the norm is ambiguous")
    # a mesh's or a placement's hash is a Python call: look at the few distinct spec objects only
    keys = [(spec.mesh, _placements.sharded_dims(spec.placements, "a DTensor grad")) for spec in gathered.specs]
    if len(set(keys)) == 1:  # FSDP2, HSDP, TP alone: one mesh, one sharding
        mesh, dims = keys[0]
        return [_MeshPlan(mesh, dims, [_MeshPart(None, True)])]
    # the grads of each distinct spec, then grouped by mesh and sharded dims (a few of each)
    by_spec: Dict[int, List[int]] = {}
    spec_of = gathered.spec_of
    for index, i in enumerate(present):
        by_spec.setdefault(spec_of[i], []).append(index)
    groups: Dict[Any, Dict[tuple, List[int]]] = {}
    for k, indices in by_spec.items():
        mesh, dims = keys[k]
        groups.setdefault(mesh, {}).setdefault(dims, []).extend(indices)
    plans = []
    for mesh, by_dims in groups.items():
        reduced = tuple(sorted(set(chain.from_iterable(by_dims))))
        coordinate = mesh.get_coordinate()
        parts = [_MeshPart(indices, all(coordinate[d] == 0 for d in reduced if d not in dims))
                 for dims, indices in by_dims.items()]
        plans.append(_MeshPlan(mesh, reduced, parts))
    return plans


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


def additive_share(norm, norm_type):
    """What adds up over shards: the maximum (inf-norm), the count (0), else the p-th power."""
    return norm if norm_type in (math.inf, 0.0) else norm.pow(norm_type)


def from_additive(total, norm_type):
    return total if norm_type in (math.inf, 0.0) else total.pow(1.0 / norm_type)


def combine_shares(values, norm_type):
    if len(values) == 1:
        return values[0]
    stacked = torch.stack(values)
    return stacked.amax() if norm_type == math.inf else stacked.sum()


def _all_reduced(found, total, groups, norm_type):
    """(flag, total) of every rank in ``groups``, one all-reduce per process group: of (flag,
    maximum) with MAX for the inf-norm, of (flag, additive share) with SUM otherwise, the flag
    then clamped to 1.0 (found_inf is 0 or 1, never a count)."""
    pair = torch.stack([found, total])
    op = torch.distributed.ReduceOp.MAX if norm_type == math.inf else torch.distributed.ReduceOp.SUM
    for group in groups:
        torch.distributed.all_reduce(pair, op=op, group=group)
    return pair[0].clamp(max=1.0), pair[1]


def _local_norm(grads, found, inv, norm_type):
    """The norm of ``grads`` (times ``inv``), setting ``found`` on inf/NaN."""
    norm = torch.empty((), dtype=torch.float32, device=found.device)
    if norm_type in FUSED_NORM_TYPES:
        ops.grad_norm_(grads, found, norm, inv, norm_type)
    else:  # torch's norm (a second read of the grads): only for other norm types
        ops.non_finite_check_(grads, found)
        norm.copy_(torch.nn.utils.get_total_norm(grads, norm_type))
        if inv is not None and norm_type != 0.0:  # a norm is homogeneous, except the count
            norm.mul_(inv)
    return norm


def _mesh_norm(grads, plans, found, inv, norm_type):
    """(flag, additive total) of DTensor grads over their meshes: each mesh's parts that count on
    this rank add up locally, then sum (or max) over the mesh dims."""
    totals = []
    for plan in plans:
        # every part is read (its inf/NaN check); the parts that count here add up
        shares = [additive_share(_local_norm(grads if part.indices is None else [grads[i] for i in part.indices],
                                             found, inv, norm_type), norm_type)
                  for part in plan.parts]
        shares = [s for s, part in zip(shares, plan.parts) if part.counts_here]
        share = (combine_shares(shares, norm_type) if shares
                 else torch.zeros((), dtype=torch.float32, device=found.device))
        found, total = _all_reduced(found, share, [plan.mesh.get_group(d) for d in plan.dims], norm_type)
        totals.append(total)
    return found, combine_shares(totals, norm_type)


def total_grad_norm(optimizer, norm_type: float, inv_scale: Optional[torch.Tensor],
                    gathered: Optional[Gathered] = None) -> Tuple[torch.Tensor, Dict[torch.device, torch.Tensor]]:
    """The total ``norm_type``-norm of the optimizer's grads (as ``gathered``, else read now)
    times ``inv_scale`` (None: the grads are unscaled already), as a 0-dim fp32 tensor on the
    first grad's device, and the inf/NaN flag of each device's grads (1.0 or 0.0). No host sync.
    With DTensor grads the local values are combined over the mesh dims each grad is sharded on
    (_mesh_plans), and with pipeline stages (``span_stages``) over the stages, so every rank gets
    the same norm and flag."""
    gathered = gathered or gather(optimizer)  # (its refs kept until the ops below have run)
    per_device, plans = _grads_per_device(type(optimizer).__name__, gathered)
    norm_type = float(norm_type)
    totals, found_infs = [], {}
    for device, device_grads in per_device.items():
        found = torch.zeros((), dtype=torch.float32, device=device)
        inv = None if inv_scale is None else inv_scale.to(device, non_blocking=True)
        if plans is None:
            total = additive_share(_local_norm(device_grads, found, inv, norm_type), norm_type)
        else:  # DTensor grads live on one device: combine flag and norm over the meshes
            found, total = _mesh_norm(device_grads, plans, found, inv, norm_type)
        totals.append(total)
        found_infs[device] = found
    stages = stage_groups(optimizer)
    if not totals:
        if not stages:
            return torch.zeros((), dtype=torch.float32), found_infs
        # a stage without grads still takes part in the stages' all-reduce
        device = next((p.device for p in gathered.params), torch.device("cpu"))
        totals, found_infs = [torch.zeros((), dtype=torch.float32, device=device)], {}
    first = totals[0].device
    total = combine_shares([t.to(first) for t in totals], norm_type)
    if stages:
        found = combine_shares([f.to(first) for f in found_infs.values()], math.inf) if found_infs \
            else torch.zeros((), dtype=torch.float32, device=first)
        found, total = _all_reduced(found, total, stages, norm_type)
        found_infs = {device: found.to(device) for device in found_infs} or {first: found}
    return from_additive(total, norm_type), found_infs
