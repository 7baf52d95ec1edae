"""The step's side of ``fused_amp.float8``'s copies (``Float8Weights``, ``MXWeights``): the
lists that make the step write the fp8 copies (ops.step_'s ``float8_weights``,
``float8_scales``, ``float8_scale_invs``, ``float8_indices``) and the params' amaxes of delayed
copies (``weight_amax``), and what follows the step: each amax into its copies' amax history,
then their delayed scaling update (MX copies need neither). The copies register themselves on
the optimizer (its ``_attached.float8_copies``); nothing here imports them."""
from collections import defaultdict

import torch


def plan(optimizer, lists) -> None:
    """Adds to a device's lists the copies of those of its params that have one; kept with the
    lists while they stay cached (the copies, scales and inverses are the same tensors every
    step)."""
    registered = optimizer._attached.float8_copies
    if not registered:
        return
    if optimizer._attached.only is not None:
        raise ValueError(f"{type(registered[0]).__name__}: the optimizer steps in backward (step_in_backward), a "
                         "bucket at a time, and those steps write no fp8 copies")
    # (position in the lists, its copies, its column there) of each param that has a copy
    held = [(position, c, c._index[id(p)]) for position, p in enumerate(lists["params"])
            for c in registered if id(p) in c._index]
    if not held:
        return
    # (only the params with copies, by index: a list with Nones in it would not trace)
    lists["float8_indices"] = [position for position, _, _ in held]
    lists["float8_weights"], lists["float8_scales"], lists["float8_scale_invs"] = (
        list(column) for column in zip(*(c._step_tensors(i) for _, c, i in held)))
    delayed = [(position, c, i) for position, c, i in held if _is_delayed(c)]
    if not delayed:
        return
    if "weight_amax" in lists:
        raise ValueError("Float8Weights: the step's params include torchao float8 weights (FSDP2's fp8 all-gather), "
                         "which take the step's amax for their own scales")
    device = delayed[0][1].scale.device
    lists["weight_amax"] = torch.zeros(len(lists["params"]), device=device)  # (zero: a skipped step records none)
    places = defaultdict(lambda: ([], []))  # copies -> (positions in the lists, columns of its history)
    for position, c, i in delayed:
        places[c][0].append(position)
        places[c][1].append(i)
    lists["float8_columns"] = [(c, torch.tensor(positions, device=device), torch.tensor(columns, device=device))
                               for c, (positions, columns) in places.items()]


def after_step(optimizer, all_lists) -> None:
    """(Called under the step's no_grad.) Each copy's amax into row 0 of its history (0 where the step was skipped, which the
    update leaves alone), then the delayed scaling update of every set of copies."""
    registered = optimizer._attached.float8_copies
    if not registered:
        return
    for lists in all_lists:
        for copies, positions, columns in lists.get("float8_columns", ()):
            copies.amax_history[0].index_copy_(0, columns, lists["weight_amax"].index_select(0, positions))
        if "float8_columns" in lists:
            lists["weight_amax"].zero_()
    for copies in registered:
        if _is_delayed(copies):
            copies.update()


def _is_delayed(copies) -> bool:
    """Whether the copies scale with an amax history (Float8Weights), not per MX block (MXWeights)."""
    return hasattr(copies, "amax_history")
