"""Adamax with fp32 master weights, one fused pass per step."""
from typing import Optional, Tuple, Union

import torch

from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._options import group_options


class Adamax(MasterWeightOptimizer):
    r"""Adamax (Adam with the infinity norm) with fp32 master weights, in one fused multi-tensor
    pass per step.

    Same arguments, defaults and update as :class:`torch.optim.Adamax` (grads unscaled by the
    GradScaler's :math:`1/s` inside the same pass):

    .. math::
        g \leftarrow \pm g / s + \lambda\theta \qquad m \leftarrow \beta_1 m + (1-\beta_1) g \qquad
        u \leftarrow \max(\beta_2 u, |g| + \epsilon) \qquad
        \theta \leftarrow \theta - \frac{\gamma}{1-\beta_1^t}\,\frac{m}{u}

    in fp32 on the master; the state is ``exp_avg`` and ``exp_inf``, as torch's.

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr (float or Tensor): learning rate (default: 2e-3).
        betas: coefficients of the running average and the infinity norm (default: (0.9, 0.999)).
        eps (float): added to :math:`|g|` (default: 1e-8).
        weight_decay (float): weight decay (L2 penalty) (default: 0).
        {torch_flags}
        {fused_amp_options}
    """

    def __init__(self, params, lr: Union[float, torch.Tensor] = 2e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 foreach: Optional[bool] = None, *, maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False, **options):
        super().__init__(params, group_options(locals()))

    _checked_in_order = ("lr", "eps", "betas", "weight_decay")  # torch's checks and messages, in its order

    _group_defaults = dict(MasterWeightOptimizer._group_defaults, foreach=None, maximize=False,
                           differentiable=False, capturable=False)

    def _hyper(self, group):
        return dict(beta1=float(group["betas"][0]), beta2=float(group["betas"][1]), eps=group["eps"],
                    weight_decay=group["weight_decay"], maximize=group["maximize"])
