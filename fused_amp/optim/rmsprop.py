"""RMSprop with fp32 master weights, one fused pass per step."""
from typing import Optional, Union

import torch

from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._options import check_in_order, check_torch_flags, check_weight_decay, group_options


class RMSprop(MasterWeightOptimizer):
    r"""RMSprop with fp32 master weights, in one fused multi-tensor pass per step.

    Same arguments, defaults and update as :class:`torch.optim.RMSprop` (grads unscaled by the
    GradScaler's :math:`1/s` inside the same pass):

    .. math::
        g &\leftarrow \pm g / s + \lambda\theta \qquad v \leftarrow \alpha v + (1-\alpha) g^2 \qquad
        \bar g \leftarrow \alpha \bar g + (1-\alpha) g \;(\text{centered}) \\
        d &= \sqrt{v - \bar g^2 \text{ (centered) or } v} + \epsilon \qquad
        b \leftarrow \mu b + g/d,\ \theta \leftarrow \theta - \gamma b \;(\mu > 0)
        \quad\text{else}\quad \theta \leftarrow \theta - \gamma g/d

    in fp32 on the master; the state is ``square_avg``, ``momentum_buffer`` (momentum > 0) and
    ``grad_avg`` (centered), as torch's.

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr (float or Tensor): learning rate (default: 1e-2).
        alpha (float): smoothing constant (default: 0.99).
        eps (float): added to the denominator (default: 1e-8).
        weight_decay (float): weight decay (L2 penalty) (default: 0).
        momentum (float): momentum factor (default: 0).
        centered (bool): normalize by an estimate of the gradient's variance (default: False).
        {torch_flags}
        {fused_amp_options}
    """

    def __init__(self, params, lr: Union[float, torch.Tensor] = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False,
                 capturable: bool = False, foreach: Optional[bool] = None, maximize: bool = False,
                 differentiable: bool = False, **options):
        super().__init__(params, group_options(locals()))

    @classmethod
    def _check_hyperparameters(cls, o):
        """torch.optim.RMSprop's checks and messages, in its order."""
        check_in_order(o, "lr", "eps")
        if not 0.0 <= o["momentum"]:
            raise ValueError(f"Invalid momentum value: {o['momentum']}")
        check_weight_decay(o["weight_decay"])
        if not 0.0 <= o["alpha"]:
            raise ValueError(f"Invalid alpha value: {o['alpha']}")
        check_torch_flags(cls.__name__, o["foreach"], None, o["differentiable"])

    _group_defaults = dict(MasterWeightOptimizer._group_defaults, momentum=0, centered=False,
                           foreach=None, maximize=False, differentiable=False, capturable=False)

    def _hyper(self, group):
        return dict(alpha=group["alpha"], eps=group["eps"], weight_decay=group["weight_decay"],
                    momentum=group["momentum"], centered=group["centered"], maximize=group["maximize"])
