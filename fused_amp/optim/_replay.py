"""The steady state of a one-group step: the op call of the last step, made again with this
step's grads, lr and hyperparameters while nothing else it was built from has changed.

torchao's offload engine makes one optimizer per param and steps each once per iteration, so a
step's host cost counts there as much as its loop (docs/offload.md). The general step
(MasterWeightOptimizer._fused_step) asks, at every step, about the scaler, clipping, fp8 scales
and copies, several groups and devices, and gathers the lists anew: 8.5-9 us on a 4k-element
param on an AMD EPYC, of which the op takes 2.3. A replay checks what the general step would
find and, when it finds the same, makes the same call: 5.4-5.6 us. Whatever differs (a
GradScaler's step, a clip, a new group, changed options or state, a traced step) takes the
general step, which builds the next replay where one applies."""
import operator
from itertools import repeat
from typing import Optional

import torch

from fused_amp import _scaling, ops
from fused_amp.optim._grad_norm import local_grads

# the group options a replay's call was built from, besides the hyperparameters (``_hyper``):
# the lists' (GroupLists' options, with the state keys: Replay.moments), the rounding's,
# unscale_grads, and the clip's (none)
_OPTIONS = ("master_weights", "state_dtype", "min_8bit_size", "float8_scales", "stochastic_rounding",
            "rounding_seed", "unscale_grads", "max_grad_norm")
_options = operator.itemgetter(*_OPTIONS)  # (a group's, as a tuple)
# where the grads and the lr go in the op's call (ops.call_step's parts after check_only)
_GRADS, _HYPER, _SCALARS = 2, 11, 12


def lr_parts(lr):
    """(the lr the op's hyper list ends with, its lr_tensor) of a group's lr: a float, or a tensor
    the op reads on the device (and 0.0 in the list)."""
    return (0.0, lr) if isinstance(lr, torch.Tensor) else (float(lr), None)


class Replay:
    """The op call of a one-group, one-device step with no scaler, no clip and no fp8 output,
    and what it was built from: the group (the same dict), its kept lists (``GroupLists``), the
    state keys its hyperparameters keep (``moments``) and its other options."""

    __slots__ = ("group", "kept", "moments", "options", "call")

    def __init__(self, group, kept, moments, call):
        self.group, self.kept, self.moments, self.call = group, kept, moments, call
        self.options = _options(group)

    @classmethod
    def of(cls, optimizer, calls, clip, inv_scale, found_inf) -> Optional["Replay"]:
        """The replay of the general step that just made ``calls`` ((group, lists, scalars) each)
        with the base class's ``_update``, or None where a later step could not repeat it."""
        if (len(calls) != 1 or clip is not None or inv_scale is not None or found_inf is not None
                or optimizer._attached.only is not None or optimizer._attached.float8_copies
                or torch.compiler.is_compiling()):
            return None
        group, lists, scalars = calls[0]
        kept = optimizer._lists.groups.get(0)
        parts = lists.get("op_parts")
        if (kept is None or len(kept.by_device) != 1 or parts is None or "call" not in parts
                or not scalars["hyper"].reusable or group["float8_scales"] is True
                or any(key in lists for key in ("sharded_params", "float8_wrappers", "float8_columns"))):
            return None
        return cls(group, kept, scalars["hyper"].moments, parts["call"])

    def run(self, optimizer) -> bool:
        """Steps ``optimizer`` as its general step would, when that step would make this call with
        other grads, lr and hyperparameters (those that keep the same states); False, having done
        nothing, otherwise."""
        groups = optimizer.param_groups
        if len(groups) != 1 or groups[0] is not self.group or torch.compiler.is_compiling():
            return False
        attached = optimizer._attached
        if (getattr(optimizer, "found_inf", None) is not None or getattr(optimizer, "grad_scale", None) is not None
                or attached.only is not None or attached.scaler_grads is not None or attached.float8_copies
                or optimizer._clip.pending is not None or optimizer._lists.groups.get(0) is not self.kept):
            return False
        group = self.group
        if _options(group) != self.options:
            return False
        hyper = self.kept.follow(optimizer, optimizer._hyper(group))
        if not hyper.reusable or hyper.moments != self.moments:
            return False
        params = group["params"]
        grads = local_grads(params)[0]
        if not (all(map(operator.is_not, grads, repeat(None)))
                and self.kept.holds(group, params, optimizer.state)):
            return False
        lr, lr_tensor = lr_parts(group["lr"])
        call = list(self.call)
        call[_GRADS] = grads
        call[_HYPER] = hyper.values + [lr, call[_HYPER][-1]]  # (max_grad_norm: none)
        call[_SCALARS] = [lr_tensor, None, None, None]  # lr_tensor, inv_scale, found_inf, grad_norm
        _scaling.stepped(optimizer)  # (without a GradScaler, as the general step records it)
        ops.call_step(False, *call)
        return True
