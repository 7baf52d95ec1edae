"""Adam and AdamW with fp32 master weights, one fused pass per step."""
from typing import Optional, Tuple, Union

import torch

from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._options import (check_betas, check_eps, check_lr, check_torch_flags,
                                      check_weight_decay, group_options)


class Adam(MasterWeightOptimizer):
    r"""Adam with fp32 master weights, in one fused multi-tensor pass per step.

    Same arguments, defaults and update as :class:`torch.optim.Adam`; the update of step
    :math:`t` (grads unscaled by the GradScaler's :math:`1/s` inside the same pass) is

    .. math::
        g &\leftarrow \pm g / s \;(-\text{ when maximize}) \qquad
        g \leftarrow g + \lambda \theta \;(\text{Adam}) \quad\text{or}\quad
        \theta \leftarrow \theta - \gamma\lambda\theta \;(\text{AdamW, decoupled}) \\
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
            (default: (0.9, 0.999)); both floats or both 1-element Tensors.
        eps (float): added to the denominator for numerical stability (default: 1e-8). It is
            applied in fp32, so 1e-8 is safe with fp16 params.
        weight_decay (float): weight decay (default: 0); L2 penalty, or decoupled with
            ``decoupled_weight_decay=True`` (AdamW).
        amsgrad (bool): use the AMSGrad variant (default: False).
        {torch_flags}
        decoupled_weight_decay (bool): AdamW's decoupled weight decay (default: False).
        {fused_amp_options}
    """

    def __init__(self, params, lr: Union[float, torch.Tensor] = 1e-3,
                 betas: Tuple[Union[float, torch.Tensor], Union[float, torch.Tensor]] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, amsgrad: bool = False, *,
                 foreach: Optional[bool] = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused: Optional[bool] = None,
                 decoupled_weight_decay: bool = False, **options):
        super().__init__(params, group_options(locals()))

    @classmethod
    def _check_hyperparameters(cls, o):
        """torch.optim.Adam's checks and messages, in its order."""
        lr, betas, foreach, capturable = o["lr"], o["betas"], o["foreach"], o["capturable"]
        if isinstance(lr, torch.Tensor):
            if foreach and not capturable:
                raise ValueError("lr as a Tensor is not supported for capturable=False and foreach=True")
        check_lr(lr)
        check_eps(o["eps"])
        check_betas(betas)
        check_weight_decay(o["weight_decay"])
        if not ((isinstance(betas[0], float) and isinstance(betas[1], float))
                or (isinstance(betas[0], torch.Tensor) and isinstance(betas[1], torch.Tensor))):
            raise ValueError("betas must be either both floats or both Tensors")
        for i, beta in enumerate(betas):
            if isinstance(beta, torch.Tensor):
                if not capturable and foreach:
                    raise ValueError(f"betas[{i}] as a Tensor is not supported for "
                                     "capturable=False and foreach=True")
                if beta.numel() != 1:
                    raise ValueError(f"Tensor betas[{i}] must be 1-element")
        check_torch_flags(cls.__name__, foreach, o["fused"], o["differentiable"])

    @staticmethod
    def _kept_options(o):
        # as torch: the first two, a 1-element tensor as a 0-dim one (torch 2.14 keeps no others)
        return dict(o, betas=tuple(b.reshape(()) if isinstance(b, torch.Tensor) else b for b in o["betas"][:2]))

    _group_defaults = dict(MasterWeightOptimizer._group_defaults, amsgrad=False, maximize=False,
                           foreach=None, capturable=False, differentiable=False,
                           decoupled_weight_decay=False, fused=None)

    def _hyper(self, group):
        return dict(beta1=float(group["betas"][0]), beta2=float(group["betas"][1]), eps=group["eps"],
                    weight_decay=group["weight_decay"], amsgrad=group["amsgrad"], maximize=group["maximize"],
                    decoupled_weight_decay=group["decoupled_weight_decay"])


class AdamW(Adam):
    r"""AdamW (decoupled weight decay) with fp32 master weights; see :class:`Adam`.

    Same arguments and defaults as :class:`torch.optim.AdamW` (``weight_decay=1e-2``), plus
    ``master_weights``, ``unscale_grads``, ``max_grad_norm``, ``grad_norm_type``, ``state_dtype``,
    ``stochastic_rounding``, ``rounding_seed``, ``min_8bit_size`` and ``float8_scales``. As in
    torch, its groups always decay decoupled, also when a checkpoint says otherwise:

    .. math::
        \theta \leftarrow \theta - \gamma\lambda\theta \qquad
        \theta \leftarrow \theta - \frac{\gamma}{1-\beta_1^t}\,
        \frac{m}{\sqrt{v}/\sqrt{1-\beta_2^t} + \epsilon}

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr (float or Tensor): learning rate (default: 1e-3).
        betas: coefficients of the running averages (default: (0.9, 0.999)).
        eps (float): added to the denominator, in fp32 (default: 1e-8).
        weight_decay (float): decoupled weight decay (default: 1e-2).
        amsgrad (bool): use the AMSGrad variant (default: False).
        {torch_flags}
        {fused_amp_options}
    """

    def __init__(self, params, lr: Union[float, torch.Tensor] = 1e-3,
                 betas: Tuple[Union[float, torch.Tensor], Union[float, torch.Tensor]] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: Optional[bool] = None, capturable: bool = False,
                 differentiable: bool = False, fused: Optional[bool] = None, **options):
        super().__init__(params, **group_options(locals()), decoupled_weight_decay=True)

    def _fix_group(self, group):
        group["decoupled_weight_decay"] = True
