"""Whole matrices from the shards of DTensor (FSDP2) params, for Newton-Schulz, and the shards
back: one all-gather per stack of same-shaped, same-placed matrices (torch.distributed's, through
DTensor), the way back a local chunk (no communication)."""
import torch

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # torch without distributed
    DTensor = None


def _stack_placements(like):
    """The placements of a stack (a new dim 0) of tensors placed as ``like``."""
    return [Shard(p.dim + 1) if p.is_shard() else p for p in like.placements]


def stack_key(like):
    """What the matrices of one stack share: global shape, mesh, placements."""
    return tuple(like.shape), like.device_mesh, tuple(like.placements)


def gather(local_stack: torch.Tensor, like) -> torch.Tensor:
    """The whole (k, A, B) stack of which ``local_stack`` holds this rank's shards of k matrices
    placed as the DTensor ``like``."""
    shape = torch.Size((local_stack.size(0),) + tuple(like.shape))
    whole = DTensor.from_local(local_stack, like.device_mesh, _stack_placements(like), run_check=False,
                               shape=shape, stride=torch.empty(shape, device="meta").stride())
    return whole.full_tensor()


def local_part(whole_stack: torch.Tensor, like) -> torch.Tensor:
    """This rank's shards of a whole (k, A, B) stack placed as ``like``: a chunk, as the params'."""
    mesh = like.device_mesh
    replicated = DTensor.from_local(whole_stack, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return replicated.redistribute(mesh, _stack_placements(like)).to_local()
