"""Lion with fp32 master weights, one fused pass per step."""
from typing import Optional, Tuple, Union

import torch

from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._options import group_options


class Lion(MasterWeightOptimizer):
    r"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2) with
    fp32 master weights, in one fused multi-tensor pass per step. The update of each step
    (grads unscaled by the GradScaler's :math:`1/s` inside the same pass):

    .. math::
        g &\leftarrow \pm g / s \;(-\text{ when maximize}) \qquad
        c \leftarrow \beta_1 m + (1-\beta_1) g \\
        \theta &\leftarrow \theta (1 - \gamma\lambda) - \gamma\,\mathrm{sign}(c) \qquad
        m \leftarrow \beta_2 m + (1-\beta_2) g

    with decoupled weight decay :math:`\lambda` as in the paper (and lion-pytorch, bitsandbytes),
    :math:`\mathrm{sign}(0) = 0` as ``torch.sign``; the moment is ``state[p]["exp_avg"]``. Each
    operation rounds once in fp32, as the same steps written with torch's tensor ops round.

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr (float or Tensor): learning rate (default: 1e-4; Lion's updates have size lr, so it
            is usually 3-10x smaller than AdamW's).
        betas: the interpolation of the update direction and the decay of the moment
            (default: (0.9, 0.99)).
        weight_decay (float): decoupled weight decay (default: 0).
        {torch_flags}
        {fused_amp_options}
    """

    def __init__(self, params, lr: Union[float, torch.Tensor] = 1e-4,
                 betas: Tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0, *,
                 maximize: bool = False, foreach: Optional[bool] = None, capturable: bool = False,
                 differentiable: bool = False, fused: Optional[bool] = None, **options):
        super().__init__(params, group_options(locals()))

    _checked_in_order = ("lr", "betas", "weight_decay")  # torch's checks and messages, in its order

    @staticmethod
    def _kept_options(o):
        return dict(o, betas=tuple(o["betas"][:2]))

    _group_defaults = dict(MasterWeightOptimizer._group_defaults, maximize=False, foreach=None,
                           capturable=False, differentiable=False, fused=None)

    def _hyper(self, group):
        return dict(beta1=float(group["betas"][0]), beta2=float(group["betas"][1]),
                    weight_decay=group["weight_decay"], maximize=group["maximize"])
