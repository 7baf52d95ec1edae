"""RAdam with fp32 master weights, one fused pass per step."""
from typing import Optional, Tuple, Union

import torch

from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._options import group_options


class RAdam(MasterWeightOptimizer):
    r"""RAdam (rectified Adam) with fp32 master weights, in one fused multi-tensor pass per step.

    Same arguments, defaults and update as :class:`torch.optim.RAdam` (grads unscaled by the
    GradScaler's :math:`1/s` inside the same pass):

    .. math::
        g &\leftarrow \pm g / s + \lambda\theta \;\text{ (or } \theta \leftarrow \theta - \gamma\lambda\theta
        \text{, decoupled)} \qquad m \leftarrow \beta_1 m + (1-\beta_1) g \qquad
        v \leftarrow \beta_2 v + (1-\beta_2) g^2 \\
        \hat m &= m / (1-\beta_1^t) \qquad
        \theta \leftarrow \theta - \gamma \hat m\, r_t \frac{\sqrt{1-\beta_2^t}}{\sqrt v + \epsilon}
        \;(\rho_t > 5) \quad\text{else}\quad \theta \leftarrow \theta - \gamma \hat m

    with :math:`\rho_t` and the rectification :math:`r_t` of Liu et al. (2020), in fp32 on the
    master; the state is ``exp_avg`` and ``exp_avg_sq``, as torch's.

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr (float or Tensor): learning rate (default: 1e-3).
        betas: coefficients of the running averages (default: (0.9, 0.999)).
        eps (float): added to the denominator (default: 1e-8).
        weight_decay (float): weight decay (default: 0); L2, or decoupled with
            ``decoupled_weight_decay=True``.
        decoupled_weight_decay (bool): AdamW-style decay (default: False).
        {torch_flags}
        {fused_amp_options}
    """

    def __init__(self, params, lr: Union[float, torch.Tensor] = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 decoupled_weight_decay: bool = False, *, foreach: Optional[bool] = None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False, **options):
        super().__init__(params, group_options(locals()))

    _checked_in_order = ("lr", "eps", "betas", "weight_decay")  # torch's checks and messages, in its order

    _group_defaults = dict(MasterWeightOptimizer._group_defaults, foreach=None, maximize=False,
                           differentiable=False, capturable=False, decoupled_weight_decay=False)

    def _hyper(self, group):
        return dict(beta1=float(group["betas"][0]), beta2=float(group["betas"][1]), eps=group["eps"],
                    weight_decay=group["weight_decay"], decoupled_weight_decay=group["decoupled_weight_decay"],
                    maximize=group["maximize"])
