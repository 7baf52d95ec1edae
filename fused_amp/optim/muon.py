"""Muon with fp32 master weights: torch.optim.Muon's update, its Newton-Schulz batched per shape."""
import math
from collections import defaultdict
from itertools import chain
from typing import Optional, Tuple, Union

import torch

from fused_amp import ops
from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._options import group_options
from fused_amp.optim import _memory, _whole_matrices
from fused_amp.optim._newton_schulz import check_ns_options, orthogonalize

# torch.optim.Muon's defaults (Keller Jordan's coefficients)
DEFAULT_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
ADJUST_LR_FNS = ("original", "match_rms_adamw", "spectral_unclamped")


def adjusted_lr_ratio(adjust_lr_fn: Optional[str], shape) -> float:
    """What torch.optim.Muon multiplies the lr of a (A, B) matrix's update by."""
    a, b = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, a / b))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(a, b))
    return math.sqrt(a / b)  # "spectral_unclamped"


def _apply_hyper(weight_decay: float) -> dict:
    """The update pass's hyperparameters: plain SGD (no momentum) over the orthogonalized
    updates, with the decay folded in as SGD's L2 term."""
    return dict(momentum=0.0, dampening=0.0, weight_decay=weight_decay, nesterov=False, maximize=False)


class Muon(MasterWeightOptimizer):
    r"""Muon (Jordan et al. 2024) for 2-D params, with fp32 master weights: the update of
    :class:`torch.optim.Muon`, with its arguments, defaults and checks. Each step (grads unscaled
    by the GradScaler's :math:`1/s` and clipped, :math:`k` the clip coefficient):

    .. math::
        g &\leftarrow k\,g / s \qquad B \leftarrow \mu B + (1-\mu) g \qquad
        \widetilde{B} \leftarrow (1-\mu) g + \mu B \text{ if nesterov else } B \\
        O &\leftarrow \mathrm{NS}^{(a,b,c)}_{n}\big(\widetilde{B} / \max(\lVert\widetilde{B}\rVert_F,
            \varepsilon)\big) \qquad
        \theta \leftarrow \theta (1 - \gamma\lambda) - \gamma\,r(A, B)\,O

    with the momentum and the step on the fp32 master (``state[p]["momentum_buffer"]`` fp32, or
    bf16 or 8-bit with ``state_dtype``; one fused pass updates it and writes the Newton-Schulz
    input in bf16), the Newton-Schulz iterations in bf16 as torch's
    (:math:`X \leftarrow aX + (bA + cA^2)X`, :math:`A = XX^T` for wide X) and :math:`r` the
    ``adjust_lr_fn`` ratio of the (A, B) shape ("original": :math:`\sqrt{\max(1, A/B)}`,
    "match_rms_adamw": :math:`0.2\sqrt{\max(A, B)}`, "spectral_unclamped": :math:`\sqrt{A/B}`).
    The matrices of one shape go through Newton-Schulz as one batched product chain (on a GPU,
    bf16 Tensor Core products; on the CPU fp32 products of the bf16 values rounded to bf16, which
    is what a bf16 product computes). The update is applied to the master in one fused pass per
    lr ratio (the SGD op's: :math:`\theta - \gamma r\,(O + \tfrac{\lambda}{r}\theta)`, the same
    value as torch's two roundings within an fp32 ulp), which writes the half param. An overflow
    step changes nothing, on the device; no step syncs with the host.

    Use it for the hidden 2-D matrices and AdamW for the rest (embeddings, heads, norms, biases);
    one GradScaler steps both (``scaler.step(muon); scaler.step(adamw)``), as with torch.

    Args:
        params: iterable of 2-D parameters or dicts defining parameter groups.
        lr (float or Tensor): learning rate (default: 1e-3).
        weight_decay (float): decoupled weight decay (default: 0.1).
        momentum (float): momentum factor (default: 0.95).
        nesterov (bool): Nesterov momentum (default: True).
        ns_coefficients (tuple of three floats): the Newton-Schulz polynomial's (a, b, c)
            (default: (3.4445, -4.7750, 2.0315)).
        eps (float): the floor of the Frobenius norm the update is divided by (default: 1e-7).
        ns_steps (int): Newton-Schulz iterations, fewer than 100 (default: 5).
        adjust_lr_fn (str, optional): "original" (the default, None), "match_rms_adamw" or
            "spectral_unclamped", as torch's.
        {fused_amp_options}
    """

    def __init__(self, params, lr: Union[float, torch.Tensor] = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: Tuple[float, float, float] = DEFAULT_NS_COEFFICIENTS, eps: float = 1e-7,
                 ns_steps: int = 5, adjust_lr_fn: Optional[str] = None, **options):
        super().__init__(params, group_options(locals()))

    @classmethod
    def _check_hyperparameters(cls, o):
        """torch.optim.Muon's checks and messages, in its order."""
        lr = o["lr"]
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not 0.0 <= o["momentum"]:
            raise ValueError(f"momentum should be >= 0 but is: {o['momentum']}")
        if not 0.0 <= o["weight_decay"]:
            raise ValueError(f"weight decay should be >= 0 but is: {o['weight_decay']}")
        if o["adjust_lr_fn"] is not None and o["adjust_lr_fn"] not in ADJUST_LR_FNS:
            raise ValueError(f"Adjust learning rate function {o['adjust_lr_fn']} is not supported")

    _step_count_saved = False  # torch.optim.Muon's state is the buffer alone

    def _check_group(self, index, group):
        super()._check_group(index, group)
        for p in group["params"]:
            if p.ndim != 2:
                raise ValueError("Muon only supports 2D parameters whereas we found a parameter "
                                 f"with size: {p.size()}")
        if group["stochastic_rounding"] and not _memory.rounded_master(group["master_weights"]):
            raise ValueError("Muon: stochastic_rounding=True rounds 24-bit masters "
                             "(master_weights='remainder8'); Muon's bf16 or 8-bit momentum rounds "
                             "to nearest")

    # the state is its momentum pass's (the update pass is SGD's, which keeps none)
    _kernel = "muon_momentum"
    _option_notes = {
        "stochastic_rounding": "Muon's momentum (bf16 or 8-bit) always rounds to nearest: this "
                               "rounds 24-bit masters (``master_weights=\"remainder8\"``) only.",
        "float8_scales": "The pass that applies the update forms the amaxes."}

    def _hyper(self, group):
        return dict(momentum=group["momentum"], nesterov=group["nesterov"])

    def _complete_loaded_state(self, p, state):
        super()._complete_loaded_state(p, state)
        if "step" not in state:  # a torch.optim.Muon checkpoint: a buffer means it has stepped
            has_buffer = state.get("momentum_buffer") is not None
            state["step"] = torch.full((), float(has_buffer), device=p.device)

    def _update(self, group, lists, scalars, check_only):
        check_ns_options(group["ns_coefficients"], group["ns_steps"])
        params, grads, masters = lists["params"], lists["grads"], lists["master_params"]
        steps = lists["steps"]  # the clean steps, counted on the device (the op skips with them)
        sharded = lists.get("sharded_params")  # DTensor (FSDP2) params, whose lists hold shards
        # Newton-Schulz's inputs: one bf16 stack per shape (of the whole matrices under FSDP2),
        # which the momentum pass writes into
        stacks = [(indices, torch.empty((len(indices),) + tuple(params[indices[0]].shape), dtype=torch.bfloat16,
                                        device=params[indices[0]].device))
                  for indices in lists["stack_indices"]]
        updates = [None] * len(params)
        for indices, stack in stacks:
            for i, matrix in zip(indices, stack.unbind()):
                updates[i] = matrix
        momentum = dict(hyper=dict(self._hyper(group), lr=0.0, max_grad_norm=scalars.get("max_grad_norm")),
                        state_absmaxes=lists["state_absmaxes"],
                        scalars={key: scalars.get(key) for key in ("inv_scale", "found_inf", "grad_norm")},
                        unscale_grads=group["unscale_grads"])
        apply = dict(scalars={"found_inf": scalars["found_inf"]}, rounding={"seed": scalars["rounding_seed"]},
                     unscale_grads=False)
        # the update pass's arguments are checked before the momentum pass, which checks its own
        # before it writes
        ops.check_step_("sgd", params, grads, masters, [], steps, hyper=dict(_apply_hyper(0.0), lr=0.0), **apply)
        (ops.check_step_ if check_only else ops.step_)(self._kernel, params, grads, [], [lists["momentum_buffer"]],
                                                       [], outputs=updates, **momentum)
        if check_only or not params:
            return
        orthogonal = self._orthogonalize(group, stacks, sharded, len(params))
        self._apply_pass(group, lists, orthogonal, scalars, apply)

    def _plan_lists(self, lists):
        """Index lists, kept with the cached lists: the matrices that go through Newton-Schulz
        together (one stack per shape; under FSDP2 per whole shape, mesh and placements), and the
        matrices of each whole shape (what the lr ratio depends on)."""
        sharded = lists.get("sharded_params")
        stacks, shapes = defaultdict(list), defaultdict(list)
        for i, p in enumerate(sharded or lists["params"]):  # (the lists are of one device)
            stacks[tuple(p.shape) if sharded is None else _whole_matrices.stack_key(p)].append(i)
            shapes[tuple(p.shape)].append(i)
        lists["stack_indices"] = list(stacks.values())
        lists["shape_indices"] = dict(shapes)

    def _orthogonalize(self, group, stacks, sharded, count):
        """Newton-Schulz of every stack; returns each param's bf16 result. The row shards of
        DTensor params go to the ranks that own their whole matrices, each rank orthogonalizes
        its own, and the results come back as row shards (_whole_matrices). (On an overflow step
        the stacks hold what the momentum pass did not write, and nothing is applied.)"""
        out = [None] * count
        for indices, stack in stacks:
            if sharded is not None:
                stack = _whole_matrices.to_owners(stack, sharded[indices[0]])
            result = orthogonalize(stack, group["ns_coefficients"], group["ns_steps"], group["eps"])
            if sharded is not None:
                result = _whole_matrices.from_owners(result, sharded[indices[0]], len(indices))
            for i, matrix in zip(indices, result.unbind()):
                out[i] = matrix
        return out

    def _apply_pass(self, group, lists, orthogonal, scalars, apply):
        """theta(1 - lr wd) - lr r O on the masters, one fused pass per lr ratio r (of the
        params' whole shapes), over the params in their order."""
        by_ratio = defaultdict(list)
        for shape, indices in lists["shape_indices"].items():
            by_ratio[adjusted_lr_ratio(group["adjust_lr_fn"], shape)].append(indices)
        params, masters, steps = lists["params"], lists["master_params"], lists["steps"]
        lr, lr_tensor = scalars["lr"], scalars["lr_tensor"]
        for ratio, shape_indices in by_ratio.items():
            indices = shape_indices[0] if len(shape_indices) == 1 else sorted(chain(*shape_indices))
            take = lambda xs: [xs[i] for i in indices] if xs else []  # noqa: E731
            params_r = take(params)
            updates = [o if o.dtype == p.dtype else o.to(p.dtype) for o, p in zip(take(orthogonal), params_r)]
            amax = lists.get("weight_amax")  # (fp8 scaling: the pass writes these params' amaxes)
            amax_r = None if amax is None else amax[indices]  # a copy, which goes back after
            ops.step_("sgd", params_r, updates, take(masters), [], take(steps),
                      hyper=dict(_apply_hyper(group["weight_decay"] / ratio), lr=lr * ratio),
                      epilogues={"weight_amax": amax_r},
                      **dict(apply, scalars=dict(apply["scalars"],
                                                 lr_tensor=None if lr_tensor is None else lr_tensor * ratio)))
            if amax_r is not None:
                amax[indices] = amax_r
