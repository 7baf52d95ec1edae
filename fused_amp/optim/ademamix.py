"""AdEMAMix with fp32 master weights, one fused pass per step."""
from typing import Optional, Tuple, Union

import torch

from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._options import check_in_order, check_torch_flags, check_weight_decay, group_options


class AdEMAMix(MasterWeightOptimizer):
    r"""AdEMAMix (Pagliardini, Ablin & Grangier 2024, "The AdEMAMix Optimizer: Better, Faster,
    Older") with fp32 master weights, in one fused multi-tensor pass per step: Adam's update
    plus a slow EMA of the gradient mixed in with weight :math:`\alpha`. Arguments, defaults and
    warm-ups as bitsandbytes' ``AdEMAMix``; the update of step :math:`t` (grads unscaled by the
    GradScaler's :math:`1/s` inside the same pass) is

    .. math::
        m_1 &\leftarrow \beta_1 m_1 + (1-\beta_1) g \qquad
        m_2 \leftarrow \beta_{3,t} m_2 + (1-\beta_{3,t}) g \qquad
        \nu \leftarrow \beta_2 \nu + (1-\beta_2) g^2 \\
        \theta &\leftarrow \theta - \gamma \left(\frac{m_1/(1-\beta_1^t) + \alpha_t m_2}
        {\sqrt{\nu}/\sqrt{1-\beta_2^t} + \epsilon} + \lambda\theta\right)

    with :math:`\alpha_t = \min(t\alpha/T_\alpha, \alpha)` and
    :math:`\beta_{3,t} = \min\left(\exp\frac{\ln\beta_1 \ln\beta_3}{(1-t/T_{\beta_3})\ln\beta_3
    + (t/T_{\beta_3})\ln\beta_1}, \beta_3\right)` during the warm-ups (``t_alpha``,
    ``t_beta3``; None: none), in fp32 on the master. The state is ``m1`` (fast EMA), ``m2``
    (slow EMA) and ``nu`` (second moment).

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr (float or Tensor): learning rate (default: 1e-3).
        betas: :math:`(\beta_1, \beta_2, \beta_3)` (default: (0.9, 0.999, 0.9999)).
        alpha (float): weight of the slow EMA (default: 5.0).
        t_alpha, t_beta3 (int, optional): warm-up lengths of :math:`\alpha` and :math:`\beta_3`
            in steps (default: None: no warm-up).
        eps (float): added to the denominator (default: 1e-8).
        weight_decay (float): decoupled weight decay (default: 1e-2).
        {torch_flags}
        {fused_amp_options}
    """

    def __init__(self, params, lr: Union[float, torch.Tensor] = 1e-3,
                 betas: Tuple[float, float, float] = (0.9, 0.999, 0.9999), alpha: float = 5.0,
                 t_alpha: Optional[int] = None, t_beta3: Optional[int] = None, eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, maximize: bool = False, foreach: Optional[bool] = None,
                 capturable: bool = False, differentiable: bool = False, fused: Optional[bool] = None,
                 **options):
        super().__init__(params, group_options(locals()))

    @classmethod
    def _check_hyperparameters(cls, o):
        """torch's messages for what torch's optimizers share; AdEMAMix's own as clearly."""
        check_in_order(o, "lr", "eps")
        betas = o["betas"]
        if len(betas) != 3:
            raise ValueError(f"Invalid betas: expected 3 values (beta1, beta2, beta3), got {len(betas)}")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
        if not 0.0 <= o["alpha"]:
            raise ValueError(f"Invalid alpha value: {o['alpha']}")
        for key in ("t_alpha", "t_beta3"):
            if o[key] is not None and not o[key] > 0:
                raise ValueError(f"Invalid {key} value: {o[key]} (a number of steps, or None)")
        check_weight_decay(o["weight_decay"])
        check_torch_flags(cls.__name__, o["foreach"], o["fused"], o["differentiable"])

    @staticmethod
    def _kept_options(o):
        return dict(o, betas=tuple(o["betas"]))

    _group_defaults = dict(MasterWeightOptimizer._group_defaults, t_alpha=None, t_beta3=None, maximize=False,
                           foreach=None, capturable=False, differentiable=False, fused=None)

    def _hyper(self, group):
        beta1, beta2, beta3 = (float(b) for b in group["betas"])
        return dict(beta1=beta1, beta2=beta2, beta3=beta3, alpha=group["alpha"], t_alpha=group["t_alpha"] or 0,
                    t_beta3=group["t_beta3"] or 0, eps=group["eps"], weight_decay=group["weight_decay"],
                    maximize=group["maximize"])
