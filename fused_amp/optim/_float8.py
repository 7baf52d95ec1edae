"""fp8 weight scales from the step, for torchao's float8 training under FSDP2.

With ``enable_fsdp_float8_all_gather=True``, each Float8Linear weight's local shard is torchao's
``WeightWithDynamicFloat8CastTensor``, and FSDP2 all-gathers it in fp8 with the scale set in
its ``_precomputed_scale``. torchao's recipe sets that with
``precompute_float8_dynamic_scale_for_fsdp(model)`` after each step: one more read of every
weight (``torch._foreach_norm(weights, inf)``) and one all-reduce. The fused step writes every
weight anyway, so it forms each one's amax in that pass (``ops.step_``'s ``weight_amax``);
:func:`hand_over` turns the amaxes into the scales as that function does, bit for bit, with the
same one all-reduce. The kernels run on the plain tensor inside the wrapper.
"""
import sys
from collections import defaultdict
from typing import List, Optional

import torch

from fused_amp.optim import _placements

try:
    from torch.distributed.tensor import DTensor, Partial, Replicate
except ImportError:  # torch built without distributed
    DTensor = Partial = Replicate = None


def _weight_class():
    """torchao's wrapper class, when torchao's float8 FSDP support is loaded (no wrapper can
    exist before it is)."""
    module = sys.modules.get("torchao.float8.fsdp_utils")
    return getattr(module, "WeightWithDynamicFloat8CastTensor", None)


def plan(lists, group) -> None:
    """Unwraps torchao's float8 weights among a device's ``lists["params"]`` (their local shards)
    into the tensors they hold, and, where the group hands scales over (``float8_scales`` True or
    None), keeps beside them the wrappers (``"float8_wrappers"``) and the amax buffer the step
    writes (``"weight_amax"``), started from the weights' amax as they are now (so that an
    overflow step, which writes none, leaves valid ones)."""
    cls = _weight_class()
    if cls is None or DTensor is None:
        return
    wrappers: List[Optional[torch.Tensor]] = [p if isinstance(p, cls) else None for p in lists["params"]]
    if not any(w is not None for w in wrappers):
        return
    lists["params"] = [p if w is None else w._tensor for p, w in zip(lists["params"], wrappers)]
    if group["float8_scales"] is not False:
        lists["float8_wrappers"] = wrappers
        lists["weight_amax"] = torch.stack(torch._foreach_norm(lists["params"], ord=float("inf"))).float()


def check_asked(name, groups, all_lists) -> None:
    """``float8_scales=True`` where no param of the step is a float8 weight would do nothing:
    refused. (Called for whole steps; a step in backward steps some params at a time.)"""
    if any(g["float8_scales"] is True for g in groups) and not any("float8_wrappers" in lists for lists in all_lists):
        raise ValueError(f"{name}: float8_scales=True, but no param with a grad is a torchao float8 weight "
                         "under FSDP2's fp8 all-gather (convert_to_float8_training with Float8LinearConfig("
                         "enable_fsdp_float8_all_gather=True), then fully_shard)")


def amax_placements(placements) -> list:
    """The placements of the stacked amaxes of weights placed so: a partial maximum over each
    mesh dim the weights are sharded on (``_StridedShard`` too, whose ``is_shard()`` says False:
    TP + FSDP2), replicated over the others; a placement ``_placements`` does not know, or a
    Partial one, raises."""
    dims = _placements.sharded_dims(placements, "a float8 weight")
    return [Partial("max") if d in dims else Replicate() for d in range(len(placements))]


def hand_over(all_lists) -> None:
    """(Called under the step's no_grad.) Sets each float8 weight's ``_precomputed_scale`` from the amax the step wrote, as
    ``precompute_float8_dynamic_scale_for_fsdp`` sets it: the amaxes in the weights' dtype,
    reduced (max) over the mesh dims the weights are sharded on by one DTensor redistribution
    for all of them, clamped to torchao's EPS, and turned into ``finfo(fp8).max / amax`` in
    float64, then float32 (and bounded by fp16's max for fp16 weights)."""
    # weights that share a mesh, placements and dtypes share the one reduction (torchao stacks all)
    batches = defaultdict(list)
    for lists in all_lists:
        wrappers = lists.get("float8_wrappers")
        if not wrappers:
            continue
        for i, (w, sharded) in enumerate(zip(wrappers, lists["sharded_params"])):
            if w is not None:
                key = (sharded.device_mesh, tuple(sharded.placements), sharded.dtype, w._dtype)
                batches[key].append((w, lists["weight_amax"][i]))
    if not batches:
        return
    from torchao.float8.float8_utils import EPS

    for (mesh, placements, dtype, fp8_dtype), items in batches.items():
        local = torch.stack([amax for _, amax in items]).to(dtype)
        amax = torch.clamp(DTensor.from_local(local, mesh, amax_placements(placements), run_check=False),
                           EPS)  # one all-reduce
        scale = torch.finfo(fp8_dtype).max / amax.to(torch.float64)
        if dtype is torch.float16:
            scale = torch.clamp(scale, max=torch.finfo(torch.float16).max)
        scales = scale.to_local().to(torch.float32)
        for i, (w, _) in enumerate(items):
            w._precomputed_scale = scales[i]
