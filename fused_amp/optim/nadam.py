"""NAdam with fp32 master weights, one fused pass per step."""
from typing import Optional, Tuple, Union

import torch

from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._options import check_in_order, check_torch_flags, group_options


class NAdam(MasterWeightOptimizer):
    r"""NAdam (Adam with Nesterov momentum, Dozat 2016) with fp32 master weights, in one fused
    multi-tensor pass per step.

    Same arguments, defaults and update as :class:`torch.optim.NAdam` (grads unscaled by the
    GradScaler's :math:`1/s` inside the same pass):

    .. math::
        \mu_t &= \beta_1 (1 - \tfrac12\, 0.96^{t\psi}) \qquad P_t = P_{t-1}\mu_t \qquad
        m \leftarrow \beta_1 m + (1-\beta_1) g \qquad v \leftarrow \beta_2 v + (1-\beta_2) g^2 \\
        \theta &\leftarrow \theta - \gamma\,\frac{1-\mu_t}{1-P_t}\,\frac{g}{d}
        - \gamma\,\frac{\mu_{t+1}}{1-P_t\mu_{t+1}}\,\frac{m}{d}, \qquad
        d = \sqrt{v/(1-\beta_2^t)} + \epsilon

    with weight decay as L2 or decoupled (``decoupled_weight_decay``), in fp32 on the master; the
    state is ``exp_avg``, ``exp_avg_sq`` and the product :math:`P_t` in ``mu_product`` (a 0-dim
    fp32 tensor on the param's device, advanced by the step on the device), as torch's.

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr (float or Tensor): learning rate (default: 2e-3).
        betas: coefficients of the running averages (default: (0.9, 0.999)).
        eps (float): added to the denominator (default: 1e-8).
        weight_decay (float): weight decay (default: 0).
        momentum_decay (float): :math:`\psi` (default: 4e-3).
        decoupled_weight_decay (bool): AdamW-style decay (default: False).
        {torch_flags}
        {fused_amp_options}
    """

    def __init__(self, params, lr: Union[float, torch.Tensor] = 2e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 momentum_decay: float = 4e-3, decoupled_weight_decay: bool = False, *,
                 foreach: Optional[bool] = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, **options):
        super().__init__(params, group_options(locals()))

    @classmethod
    def _check_hyperparameters(cls, o):
        """torch.optim.NAdam's checks and messages, in its order."""
        check_in_order(o, "lr", "eps", "betas", "weight_decay")
        if not 0.0 <= o["momentum_decay"]:
            raise ValueError(f"Invalid momentum_decay value: {o['momentum_decay']}")
        check_torch_flags(cls.__name__, o["foreach"], None, o["differentiable"])

    _group_defaults = dict(MasterWeightOptimizer._group_defaults, foreach=None, maximize=False,
                           differentiable=False, capturable=False, decoupled_weight_decay=False)

    def _hyper(self, group):
        return dict(beta1=float(group["betas"][0]), beta2=float(group["betas"][1]), eps=group["eps"],
                    weight_decay=group["weight_decay"], momentum_decay=group["momentum_decay"],
                    decoupled_weight_decay=group["decoupled_weight_decay"], maximize=group["maximize"])
