"""Rprop with fp32 master weights, one fused pass per step."""
from typing import Optional, Tuple, Union

import torch

from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._options import check_lr, check_torch_flags, group_options


class Rprop(MasterWeightOptimizer):
    r"""Rprop (resilient backpropagation) with fp32 master weights, in one fused multi-tensor
    pass per step.

    Same arguments, defaults and update as :class:`torch.optim.Rprop` (grads unscaled by the
    GradScaler's :math:`1/s` inside the same pass); per element, with :math:`g \leftarrow \pm g/s`
    and :math:`\sigma = \operatorname{sign}(g\, g_{prev})`:

    .. math::
        \eta &\leftarrow \operatorname{clamp}\big(\eta \cdot (\eta_+ \text{ if } \sigma > 0,\
        \eta_- \text{ if } \sigma < 0, \text{ else } 1),\ \Gamma_{min}, \Gamma_{max}\big) \\
        g &\leftarrow 0 \text{ where } \sigma < 0 \qquad
        \theta \leftarrow \theta - \eta \operatorname{sign}(g) \qquad g_{prev} \leftarrow g

    in fp32 on the master; the state is ``prev`` and ``step_size`` (which starts at ``lr``: the
    learning rate sets the first step sizes only, as in torch), as torch's.

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr (float or Tensor): the initial step size (default: 1e-2).
        etas (Tuple[float, float]): the multiplicative decrease and increase factors
            :math:`(\eta_-, \eta_+)` (default: (0.5, 1.2)).
        step_sizes (Tuple[float, float]): the minimal and maximal step sizes (default: (1e-6, 50)).
        {torch_flags}
        {fused_amp_options}
    """

    def __init__(self, params, lr: Union[float, torch.Tensor] = 1e-2, etas: Tuple[float, float] = (0.5, 1.2),
                 step_sizes: Tuple[float, float] = (1e-6, 50), *, capturable: bool = False,
                 foreach: Optional[bool] = None, maximize: bool = False, differentiable: bool = False,
                 **options):
        super().__init__(params, group_options(locals()))

    @classmethod
    def _check_hyperparameters(cls, o):
        """torch.optim.Rprop's checks and messages, in its order."""
        check_lr(o["lr"])
        etas = o["etas"]
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        check_torch_flags(cls.__name__, o["foreach"], None, o["differentiable"])

    _group_defaults = dict(MasterWeightOptimizer._group_defaults, foreach=None, maximize=False,
                           differentiable=False, capturable=False)

    def _initial_state(self, group):
        return {"step_size": float(group["lr"])}

    def _hyper(self, group):
        return dict(eta_minus=float(group["etas"][0]), eta_plus=float(group["etas"][1]),
                    step_size_min=float(group["step_sizes"][0]), step_size_max=float(group["step_sizes"][1]),
                    maximize=group["maximize"])
