"""Step in backward: each param steps as soon as its grad is accumulated, and its grad is freed
("gradient release": torchtune's optimizer_in_bwd, FlashOptim's 5 bytes per param)."""
import contextlib
import weakref
from typing import Optional

import torch

from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._grad_norm import DTensor

# the handles in force, for the GradScaler's refusal (fused_amp.GradScaler.scale)
_active: "weakref.WeakSet[StepInBackward]" = weakref.WeakSet()

DEFAULT_BUCKET_BYTES = 4 * 1024 * 1024


def any_active() -> bool:
    return len(_active) > 0


class StepInBackward:
    """What :func:`step_in_backward` returns: ``remove()`` restores the normal loop;
    ``no_step()`` is a context manager for backward passes that only accumulate."""

    def __init__(self, optimizer: MasterWeightOptimizer, bucket_bytes: int):
        self._optimizer = optimizer
        self.bucket_bytes = bucket_bytes
        self._pending, self._pending_bytes = [], 0
        self._flush_queued = False
        self._accumulating = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready)
                       for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        optimizer._attached.in_backward = self
        _active.add(self)

    def _grad_ready(self, p: torch.Tensor) -> None:
        if self._accumulating or p.grad is None:
            return
        if p.grad.is_sparse:
            raise RuntimeError(f"step_in_backward: {type(self._optimizer).__name__} got a sparse grad; "
                               "the fused step takes dense grads only")
        if not self._flush_queued:  # the params still pending when this backward ends step then
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._flush_queued = True
        self._pending.append(p)
        self._pending_bytes += p.grad.numel() * p.grad.element_size()
        if self._pending_bytes >= self.bucket_bytes:
            self._flush()

    def _end_of_backward(self) -> None:
        self._flush_queued = False
        self._flush()
        self._optimizer._hand_over_after_backward()

    def _flush(self) -> None:
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if not pending:
            return
        self._optimizer._step_params(pending)
        for p in pending:
            p.grad = None

    @contextlib.contextmanager
    def no_step(self):
        """A context manager: backward passes inside it accumulate the grads as without
        step_in_backward (nothing steps, nothing is freed); the next backward outside it steps
        with the accumulated grads. Gradient accumulation over k micro-batches: k - 1 backwards
        inside, the last outside."""
        self._accumulating = True
        try:
            yield
        finally:
            self._accumulating = False

    def remove(self) -> None:
        """Restore the normal loop: hooks removed, ``step()`` and ``zero_grad()`` work again."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._optimizer._attached.in_backward is self:
            self._optimizer._attached.in_backward = None
        _active.discard(self)


def step_in_backward(optimizer: MasterWeightOptimizer, bucket_bytes: Optional[int] = None) -> StepInBackward:
    r"""Step ``optimizer``'s params inside backward, as their grads arrive, and free the grads.

    A ``register_post_accumulate_grad_hook`` on every param collects the params whose grads are
    ready; once they hold ``bucket_bytes`` of grads (default 4 MiB; 0: every param alone), or
    when backward ends, they take one fused step (the same step as :meth:`step`, with the
    group's lr and options read then: LR schedulers and param-group changes apply as they do
    with ``step()``) and their ``.grad`` is set to None. The grads of a bf16 model are never all
    held at once: 2 bytes per param less (with 8-bit state, ``master_weights="remainder"`` 6
    instead of 8 bytes per param, ``"remainder8"`` 5 instead of 7), at the cost of one op call
    per bucket.

    While the returned handle is in force, ``optimizer.step()`` and ``zero_grad()`` do nothing
    (a loop written for the normal path runs unchanged), every backward is one step of each
    param it reaches (step counts advance once per backward), ``state_dict()`` and
    ``load_state_dict()`` work as always, and ``handle.remove()`` restores the normal loop.
    Gradient accumulation: run the backward passes that only accumulate inside
    ``with handle.no_step():``.

    Refused, with the reason, before anything changes: an optimizer with ``max_grad_norm``
    (clipping by the global norm needs every grad before any step; so does
    ``optimizer.clip_grad_norm_`` while the handle is in force), fp16 params (they need a
    GradScaler, whose skip-the-whole-step contract needs every grad: bf16 and fp32 weights need
    none, which is what this is for), and ``fused_amp.GradScaler.scale`` while any handle is in
    force, and params that are not DTensors in a run of several ranks (under DDP the reducer
    averages the grads after the hooks fire: use FSDP2, whose post-accumulate hooks fire on the
    reduce-scattered grad shards). A sparse grad raises when it arrives.

    Example::

        opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-3)
        handle = fused_amp.optim.step_in_backward(opt)
        for step in range(3):
            x = torch.randn(4, 8, dtype=torch.bfloat16)
            model(x).float().pow(2).mean().backward()  # the params step here
        handle.remove()
    """
    name = type(optimizer).__name__
    if not isinstance(optimizer, MasterWeightOptimizer):
        raise TypeError(f"step_in_backward: {type(optimizer).__module__}.{type(optimizer).__qualname__} is not a "
                        "fused_amp.optim optimizer")
    if optimizer._attached.in_backward is not None:
        raise RuntimeError(f"step_in_backward: this {name} already steps in backward (remove() its handle first)")
    if optimizer.max_grad_norm is not None:
        raise ValueError(f"step_in_backward: {name} has max_grad_norm={optimizer.max_grad_norm}; clipping by the "
                         "global grad norm needs every grad before any param steps")
    dist = torch.distributed
    ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    for index, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            if p.dtype == torch.float16:
                raise ValueError(f"step_in_backward: param {i} of group {index} is float16; fp16 training needs a "
                                 "GradScaler, whose skip-the-whole-step contract needs every grad before any "
                                 "param steps (bf16 or fp32 weights need none)")
            if ranks > 1 and not (DTensor is not None and isinstance(p, DTensor)):
                raise RuntimeError(f"step_in_backward: param {i} of group {index} is not a DTensor in a "
                                   f"{ranks}-rank run: under DDP the reducer averages the grads after they "
                                   "arrive, so a param stepping then would step its own rank's grad; shard the "
                                   "model with FSDP2 (fully_shard) instead")
    bucket = DEFAULT_BUCKET_BYTES if bucket_bytes is None else int(bucket_bytes)
    if bucket < 0:
        raise ValueError(f"step_in_backward: bucket_bytes must be >= 0, got {bucket_bytes}")
    return StepInBackward(optimizer, bucket)
