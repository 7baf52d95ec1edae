"""SGD (with momentum, dampening, Nesterov) with fp32 master weights, one fused pass per step."""
from typing import Optional, Union

import torch

from fused_amp.optim._base import MasterWeightOptimizer
from fused_amp.optim._options import check_torch_flags, group_options


class SGD(MasterWeightOptimizer):
    r"""SGD with fp32 master weights, in one fused multi-tensor pass per step.

    Same arguments, defaults and update as :class:`torch.optim.SGD`:

    .. math::
        g &\leftarrow \pm g / s + \lambda\theta \qquad
        b \leftarrow g \;(\text{first step}) \;\text{ or }\; \mu b + (1-\tau) g \\
        \theta &\leftarrow \theta - \gamma\,(g + \mu b \text{ if nesterov else } b)
        \qquad (\mu = 0:\ \theta \leftarrow \theta - \gamma g)

    in fp32 on the master, written back to the param rounded to its dtype. The momentum buffer
    is ``state[p]["momentum_buffer"]`` (fp32); ``state[p]["step"]`` counts the clean steps on the
    device, so that a first step skipped for overflow still starts the buffer from the gradient.

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr (float or Tensor): learning rate (default: 1e-3).
        momentum (float): momentum factor (default: 0).
        dampening (float): dampening for momentum (default: 0).
        weight_decay (float): weight decay (L2 penalty) (default: 0).
        nesterov (bool): enables Nesterov momentum (default: False).
        {torch_flags}
        {fused_amp_options}
    """

    def __init__(self, params, lr: Union[float, torch.Tensor] = 1e-3, momentum: float = 0,
                 dampening: float = 0, weight_decay: Union[float, torch.Tensor] = 0, nesterov: bool = False,
                 *, maximize: bool = False, foreach: Optional[bool] = None, differentiable: bool = False,
                 fused: Optional[bool] = None, **options):
        super().__init__(params, group_options(locals()))

    @classmethod
    def _check_hyperparameters(cls, o):
        """torch.optim.SGD's checks and messages, in its order."""
        lr, momentum = o["lr"], o["momentum"]
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if o["weight_decay"] < 0.0:
            raise ValueError(f"Invalid weight_decay value: {o['weight_decay']}")
        if o["nesterov"] and (momentum <= 0 or o["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        check_torch_flags(cls.__name__, o["foreach"], o["fused"], o["differentiable"])

    _step_count_saved = False  # torch.optim.SGD's state is the buffer alone
    _group_defaults = dict(MasterWeightOptimizer._group_defaults, nesterov=False, maximize=False,
                           foreach=None, differentiable=False, fused=False)

    def _hyper(self, group):
        return dict(momentum=group["momentum"], dampening=group["dampening"],
                    weight_decay=float(group["weight_decay"]), nesterov=group["nesterov"],
                    maximize=group["maximize"])

    def _counts_steps(self, group, scalars):
        # with momentum (a first step starts the buffer), and for the random bits of stochastic
        # rounding, which change with the step
        return group["momentum"] != 0 or scalars["rounding_seed"] is not None

    def _complete_loaded_state(self, p, state):
        super()._complete_loaded_state(p, state)
        if "step" not in state:  # a torch.optim.SGD checkpoint: a buffer means it has stepped
            has_buffer = state.get("momentum_buffer") is not None
            state["step"] = torch.full((), float(has_buffer), device=p.device)
        if state.get("momentum_buffer", 0) is None:
            del state["momentum_buffer"]
