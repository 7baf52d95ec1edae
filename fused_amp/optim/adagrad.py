"""Adagrad with fp32 master weights, one fused pass per step."""
from typing import Optional, Union

import torch

from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._options import (check_eps, check_lr, check_torch_flags, check_weight_decay,
                                      group_options)


class Adagrad(MasterWeightOptimizer):
    r"""Adagrad with fp32 master weights, in one fused multi-tensor pass per step.

    Same arguments, defaults and update as :class:`torch.optim.Adagrad`; the update of step
    :math:`t` (grads unscaled by the GradScaler's :math:`1/s` inside the same pass) is

    .. math::
        g \leftarrow \pm g / s + \lambda\theta \qquad
        s \leftarrow s + g^2 \qquad
        \theta \leftarrow \theta - \frac{\gamma}{1 + (t-1)\eta}\,\frac{g}{\sqrt{s} + \epsilon}

    in fp32 on the master. As in torch, ``state[p]["sum"]`` (starting at
    ``initial_accumulator_value``) and ``state[p]["step"]`` exist from construction on. The sum
    only grows: stored in bf16 or 8 bits it rounds stochastically by default
    (``stochastic_rounding=None``), since rounded to nearest each increment below half its
    rounding step would be lost (``python benchmarks/adagrad_sum.py`` measures both).

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr (float or Tensor): learning rate (default: 1e-2).
        lr_decay (float): learning rate decay :math:`\eta` (default: 0).
        weight_decay (float): weight decay (L2 penalty) (default: 0).
        initial_accumulator_value (float): the sum's starting value (default: 0).
        eps (float): added to the denominator (default: 1e-10).
        {torch_flags}
        {fused_amp_options}
    """

    def __init__(self, params, lr: Union[float, torch.Tensor] = 1e-2, lr_decay: float = 0,
                 weight_decay: float = 0, initial_accumulator_value: float = 0, eps: float = 1e-10,
                 foreach: Optional[bool] = None, *, maximize: bool = False, differentiable: bool = False,
                 fused: Optional[bool] = None, **options):
        super().__init__(params, group_options(locals()))
        for group in self.param_groups:  # torch.optim.Adagrad creates its state here
            moments = self._state_keys_for(group)
            for p in group["params"]:
                self._init_state(p, group, moments)

    @classmethod
    def _check_hyperparameters(cls, o):
        """torch.optim.Adagrad's checks and messages, in its order."""
        check_lr(o["lr"])
        if not 0.0 <= o["lr_decay"]:
            raise ValueError(f"Invalid lr_decay value: {o['lr_decay']}")
        check_weight_decay(o["weight_decay"])
        if not 0.0 <= o["initial_accumulator_value"]:
            raise ValueError(f"Invalid initial_accumulator_value value: {o['initial_accumulator_value']}")
        check_eps(o["eps"])
        if o["fused"] and o["differentiable"]:
            raise RuntimeError("`fused` does not support `differentiable`")
        check_torch_flags(cls.__name__, o["foreach"], o["fused"], o["differentiable"])

    _group_defaults = dict(MasterWeightOptimizer._group_defaults, foreach=None, maximize=False,
                           differentiable=False, fused=None)

    def _initial_state(self, group):
        return {"sum": group["initial_accumulator_value"]}

    _running_sums = True

    def _hyper(self, group):
        return dict(lr_decay=group["lr_decay"], weight_decay=group["weight_decay"], eps=group["eps"],
                    maximize=group["maximize"])

    def share_memory(self):
        """Moves each param's sum to shared memory, as torch.optim.Adagrad.share_memory."""
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["sum"].share_memory_()
