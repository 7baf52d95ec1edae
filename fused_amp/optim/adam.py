"""Adam and AdamW with fp32 master weights, one fused pass per step."""
from typing import Tuple, Union

import torch

from fused_amp import ops
from fused_amp.optim._base import MasterWeightOptimizer, check_common, lists_or_empty


class Adam(MasterWeightOptimizer):
    r"""Adam with fp32 master weights, in one fused multi-tensor pass per step.

    Same arguments, defaults and update as :class:`torch.optim.Adam`; the update of step
    :math:`t` (grads unscaled by the GradScaler's :math:`1/s` inside the same pass) is

    .. math::
        g &\leftarrow \pm g / s \;(-\text{ when maximize}) \qquad
        g \leftarrow g + \lambda \theta \;(\text{Adam}) \quad\text{or}\quad
        \theta \leftarrow \theta - \gamma\lambda\theta \;(\text{AdamW}) \\
        m &\leftarrow \beta_1 m + (1-\beta_1) g \qquad v \leftarrow \beta_2 v + (1-\beta_2) g^2
        \qquad \hat v = \max(\hat v, v) \;(\text{amsgrad}) \\
        \theta &\leftarrow \theta - \frac{\gamma}{1-\beta_1^t}\,
        \frac{m}{\sqrt{v\text{ or }\hat v}/\sqrt{1-\beta_2^t} + \epsilon}

    computed in fp32 on the master :math:`\theta` (``state[p]["master_param"]`` for an
    fp16/bf16 param), which is then written to the param rounded to its dtype.

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr (float or Tensor): learning rate (default: 1e-3).
        betas: coefficients for the running averages of the gradient and its square
            (default: (0.9, 0.999)).
        eps (float): added to the denominator for numerical stability (default: 1e-8). It is
            applied in fp32, so 1e-8 is safe with fp16 params.
        weight_decay (float): weight decay (L2 penalty) (default: 0).
        amsgrad (bool): use the AMSGrad variant (default: False).
        maximize (bool): maximize the objective instead of minimizing (default: False).
        master_weights (bool): keep fp32 masters for fp16/bf16 params (default: True). With
            False, half params are updated in place (fp32 math and state, rounded each step).
    """

    _decoupled_weight_decay = False

    def __init__(self, params, lr: Union[float, torch.Tensor] = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *, maximize: bool = False,
                 master_weights: bool = True):
        check_common(lr, weight_decay)
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, master_weights=master_weights)
        super().__init__(params, defaults)

    def _state_keys_for(self, group):
        return ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())

    def _update(self, group, lists, lr, lr_tensor, inv_scale, found_inf):
        beta1, beta2 = group["betas"]
        ops.adam_step_(lists["params"], lists["grads"], lists["master_params"], lists["exp_avg"],
                       lists["exp_avg_sq"], lists_or_empty(lists, "max_exp_avg_sq", group["amsgrad"]),
                       lists["steps"], lr=lr, lr_tensor=lr_tensor, beta1=beta1, beta2=beta2,
                       eps=group["eps"], weight_decay=group["weight_decay"],
                       amsgrad=group["amsgrad"], maximize=group["maximize"],
                       decoupled_weight_decay=self._decoupled_weight_decay,
                       inv_scale=inv_scale, found_inf=found_inf)


class AdamW(Adam):
    r"""AdamW (decoupled weight decay) with fp32 master weights; see :class:`Adam`.

    Same arguments and defaults as :class:`torch.optim.AdamW` (``weight_decay=1e-2``), plus
    ``master_weights``.
    """

    _decoupled_weight_decay = True

    def __init__(self, params, lr: Union[float, torch.Tensor] = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 master_weights: bool = True):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         master_weights=master_weights)
