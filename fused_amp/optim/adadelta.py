"""Adadelta with fp32 master weights, one fused pass per step."""
from typing import Optional, Union

import torch

from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._options import check_in_order, check_lr, check_torch_flags, group_options


class Adadelta(MasterWeightOptimizer):
    r"""Adadelta with fp32 master weights, in one fused multi-tensor pass per step.

    Same arguments, defaults and update as :class:`torch.optim.Adadelta` (grads unscaled by the
    GradScaler's :math:`1/s` inside the same pass):

    .. math::
        g &\leftarrow \pm g / s + \lambda\theta \qquad v \leftarrow \rho v + (1-\rho) g^2 \qquad
        \Delta = \frac{\sqrt{u + \epsilon}}{\sqrt{v + \epsilon}}\, g \\
        u &\leftarrow \rho u + (1-\rho) \Delta^2 \qquad \theta \leftarrow \theta - \gamma \Delta

    in fp32 on the master; the state is ``square_avg`` and ``acc_delta``, as torch's.

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr (float or Tensor): coefficient that scales :math:`\Delta` (default: 1.0).
        rho (float): coefficient of the running averages (default: 0.9).
        eps (float): added inside both square roots (default: 1e-6).
        weight_decay (float): weight decay (L2 penalty) (default: 0).
        {torch_flags}
        {fused_amp_options}
    """

    def __init__(self, params, lr: Union[float, torch.Tensor] = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0, foreach: Optional[bool] = None, *, capturable: bool = False,
                 maximize: bool = False, differentiable: bool = False, **options):
        super().__init__(params, group_options(locals()))

    @classmethod
    def _check_hyperparameters(cls, o):
        """torch.optim.Adadelta's checks and messages, in its order."""
        check_lr(o["lr"])
        if not 0.0 <= o["rho"] <= 1.0:
            raise ValueError(f"Invalid rho value: {o['rho']}")
        check_in_order(o, "eps", "weight_decay")
        check_torch_flags(cls.__name__, o["foreach"], None, o["differentiable"])

    _group_defaults = dict(MasterWeightOptimizer._group_defaults, foreach=None, maximize=False,
                           differentiable=False, capturable=False)

    def _hyper(self, group):
        return dict(rho=group["rho"], eps=group["eps"], weight_decay=group["weight_decay"],
                    maximize=group["maximize"])
