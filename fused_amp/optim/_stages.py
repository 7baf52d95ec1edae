"""Pipeline stages: what spans them. Each stage's ranks hold their own params and optimizer;
the clip norm and the overflow flag are global, so they are combined over the process group
that joins the stages (torchtitan's ``pp_mesh``), set once per optimizer by ``span_stages``."""
from typing import List

import torch

_KEY = "_fused_amp_stage_groups"  # in the optimizer's __dict__, outside its state and checkpoints


def span_stages(optimizer, pp_mesh):
    r"""Make ``optimizer``'s clip norm and its GradScaler overflow flag span the pipeline stages
    joined by ``pp_mesh`` (a 1-D ``DeviceMesh``, as torchtitan's ``world_mesh["pp"]``, or a
    ``ProcessGroup``), and return ``optimizer``.

    With ``torch.distributed.pipelining`` each stage steps only its own params. The total norm of
    ``max_grad_norm`` and :meth:`~fused_amp.optim.Adam.clip_grad_norm_` is then summed over the
    stages (one more all-reduce, of the norm and the flag together), and ``fused_amp.GradScaler``
    combines its overflow flag over them with a MAX all-reduce, so every stage clips by the same
    coefficient and every stage skips or steps together. Works for any optimizer that
    ``fused_amp.GradScaler`` steps (for its overflow flag); the norm is ours only. None undoes it.
    """
    if pp_mesh is None:
        optimizer.__dict__.pop(_KEY, None)
        return optimizer
    if hasattr(pp_mesh, "get_group"):
        if pp_mesh.ndim != 1:
            raise ValueError(f"span_stages: pp_mesh must be a 1-D DeviceMesh (the pipeline dim), got {pp_mesh.ndim} "
                             "dims")
        group = pp_mesh.get_group()
    elif isinstance(pp_mesh, torch.distributed.ProcessGroup):
        group = pp_mesh
    else:
        raise TypeError(f"span_stages: pp_mesh must be a DeviceMesh or a ProcessGroup, got {type(pp_mesh).__name__}")
    optimizer.__dict__[_KEY] = [group]
    return optimizer


def stage_groups(optimizer) -> List:
    """The process groups joining ``optimizer``'s pipeline stages (``span_stages``); [] if none."""
    return optimizer.__dict__.get(_KEY, [])
