"""Whole matrices from the shards of DTensor (FSDP2) params, for Newton-Schulz, and the shards
back, through DTensor's redistribution (torch.distributed's collectives). A stack of k
same-shaped, same-placed matrices, each sharded by rows over the ranks, becomes whole matrices
split over the ranks by owner (the k split over every mesh dim that shards the matrices, in
mesh order: on one dim rank r owns the r-th torch.chunk of the k): each rank
orthogonalizes only its own, and the results go back to the row shards. Two all-to-alls
(on gloo, which has none, DTensor all-gathers and keeps its chunk), against one all-gather with
every rank orthogonalizing every matrix: the same bytes for 2 ranks, fewer for more, and the
compute split over the ranks. Any mix of Shard, _StridedShard (FSDP2 over a TP-split dim) and
Replicate placements on any mesh dims; Partial ones, and placements not known, raise
(_placements)."""
import torch

from fused_amp.optim import _placements

try:
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # torch without distributed
    DTensor = None


def stack_key(like):
    """What the matrices of one stack share: global shape, mesh, placements."""
    return tuple(like.shape), like.device_mesh, tuple(like.placements)


def _as_dtensor(local, like, placements, k):
    shape = torch.Size((k,) + tuple(like.shape))
    return DTensor.from_local(local, like.device_mesh, placements, run_check=False, shape=shape,
                              stride=torch.empty(shape, device="meta").stride())


def _row_placements(like):
    """The placements of a stack (a new dim 0) of matrices placed as ``like``."""
    return [_placements.shifted(p) for p in like.placements]


def _owner_placements(like):
    """The same stack split by whole matrices over the mesh dims that shard ``like``."""
    sharded = _placements.sharded_dims(like.placements, "a Muon param")
    return [Shard(0) if dim in sharded else p for dim, p in enumerate(like.placements)]


def to_owners(local_stack: torch.Tensor, like) -> torch.Tensor:
    """The whole matrices this rank owns, of the stack whose row shards ``local_stack`` holds."""
    k = local_stack.size(0)
    return _as_dtensor(local_stack, like, _row_placements(like), k).redistribute(
        like.device_mesh, _owner_placements(like)).to_local()


def from_owners(owned: torch.Tensor, like, k: int) -> torch.Tensor:
    """This rank's row shards of the k matrices of a stack, from the whole ones each rank owns."""
    return _as_dtensor(owned, like, _owner_placements(like), k).redistribute(
        like.device_mesh, _row_placements(like)).to_local()
