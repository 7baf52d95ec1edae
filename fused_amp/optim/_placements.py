"""DTensor placements read by what they do to a tensor, not by their class.

torch's parallel APIs give a param one placement per mesh dim: ``Shard(d)`` (TP's row or column
split, FSDP2's dim-0 split), ``_StridedShard(d, split_factor)`` (what ``fully_shard`` gives over
a dim that TP has already split; in torch 2.14 ``is_shard()`` answers False for it, though each
rank holds a disjoint piece), ``Replicate()`` (a TP bias, HSDP's replicate dim) and ``Partial``
(a pending sum). Whatever reduces over the whole tensor (a clip norm, Muon's whole matrices) must
know, per mesh dim, whether the ranks along it hold different pieces, the same values, or
addends; a placement this module does not know raises, naming it."""
from typing import Tuple

try:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard
except ImportError:  # torch without distributed
    Shard = _StridedShard = None

SHARD, REPLICATE, PARTIAL = "shard", "replicate", "partial"


def kind(placement, what: str = "a DTensor", mesh_dim: int = 0) -> str:
    """SHARD (the ranks along this mesh dim hold disjoint pieces), REPLICATE (the same values)
    or PARTIAL (addends of the value); any other placement raises NotImplementedError."""
    if isinstance(placement, _StridedShard) or placement.is_shard():
        return SHARD
    if placement.is_replicate():
        return REPLICATE
    if placement.is_partial():
        return PARTIAL
    raise NotImplementedError(f"{what} has the placement {placement!r} on mesh dim {mesh_dim}, which "
                              "fused_amp does not know how to reduce over")


def sharded_dims(placements, what: str = "a DTensor") -> Tuple[int, ...]:
    """The mesh dims whose ranks hold disjoint pieces of a tensor with ``placements``; Partial
    placements raise (their values are not reduced yet)."""
    dims = []
    for dim, placement in enumerate(placements):
        k = kind(placement, what, dim)
        if k == PARTIAL:
            raise NotImplementedError(f"{what} has the placement {placement!r} on mesh dim {dim}: its values "
                                      "are addends still to be reduced; reduce them (redistribute to Replicate "
                                      "or Shard) first")
        if k == SHARD:
            dims.append(dim)
    return tuple(dims)


def shifted(placement, by: int = 1):
    """The placement of a stack of tensors (``by`` new leading dims) placed as ``placement``: a
    shard moves to the same tensor dim of each stacked tensor, the rest stay as they are."""
    if isinstance(placement, _StridedShard):
        return _StridedShard(placement.dim + by, split_factor=placement.split_factor)
    if placement.is_shard():
        return Shard(placement.dim + by)
    return placement
