"""The swap where real scripts make it: a torch.optim optimizer that library code built
(nanoGPT's ``configure_optimizers``, HF's ``create_optimizer``) becomes ours."""
import inspect

import torch

from fused_amp.optim.adadelta import Adadelta
from fused_amp.optim.adagrad import Adagrad
from fused_amp.optim.adam import Adam, AdamW
from fused_amp.optim.adamax import Adamax
from fused_amp.optim.nadam import NAdam
from fused_amp.optim.radam import RAdam
from fused_amp.optim.rmsprop import RMSprop
from fused_amp.optim.rprop import Rprop
from fused_amp.optim.sgd import SGD

_COUNTERPARTS = {torch.optim.Adam: Adam, torch.optim.AdamW: AdamW, torch.optim.SGD: SGD,
                 torch.optim.Adagrad: Adagrad, torch.optim.RMSprop: RMSprop, torch.optim.Adamax: Adamax,
                 torch.optim.RAdam: RAdam, torch.optim.NAdam: NAdam, torch.optim.Adadelta: Adadelta,
                 torch.optim.Rprop: Rprop}


def from_optimizer(optimizer: torch.optim.Optimizer, **options):
    """The fused_amp counterpart of a ``torch.optim`` optimizer, over the same params in the
    same param groups, with every group option carried across (lr, betas, weight decay per
    group, ``amsgrad``, ``maximize``, ...), and its state if it has stepped.

    ``torch.optim.Adam``, ``AdamW``, ``SGD``, ``Adagrad``, ``RMSprop``, ``Adamax``, ``RAdam``,
    ``NAdam``, ``Adadelta`` and ``Rprop`` become their namesakes here; ``options`` are ours for every group (``master_weights``, ``state_dtype``,
    ``max_grad_norm``, ...)::

        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)  # library code's
        optimizer = fused_amp.optim.from_optimizer(optimizer, master_weights="remainder")

    Build LR schedulers after the swap (a scheduler holds the optimizer it was built over).
    The torch optimizer is left as it was; its groups are copied, not shared.

    Raises ``TypeError`` for an optimizer without a counterpart here, and ``ValueError`` (or
    the constructor's own error) for a torch option the counterpart does not have or cannot
    honour (``differentiable=True``), before anything is built. Keys of a script's own in the
    groups (a group name) are kept, as torch keeps them.
    """
    cls = _COUNTERPARTS.get(type(optimizer))
    if cls is None:
        raise TypeError(f"from_optimizer: no fused_amp counterpart for {type(optimizer).__module__}."
                        f"{type(optimizer).__qualname__} (fused_amp.optim has the counterparts of torch.optim's "
                        f"{', '.join(c.__name__ for c in _COUNTERPARTS)}, and Lion, Muon and AdEMAMix)")
    arguments = set(inspect.signature(cls).parameters) - {"params"}
    defaults = {k: v for k, v in optimizer.defaults.items() if k in arguments}
    groups = []
    for index, group in enumerate(optimizer.param_groups):
        # torch's options the counterpart lacks (other keys, a script's own, are kept as torch keeps them)
        lacking = [k for k in group if k in optimizer.defaults and k not in arguments
                   and not (cls is AdamW and k == "decoupled_weight_decay" and group[k])]
        if lacking:
            raise ValueError(f"from_optimizer: param group {index} has {lacking[0]!r}, an option "
                             f"{cls.__name__} does not have")
        copied = dict(group, params=list(group["params"]), **options)
        cls._check_hyperparameters(dict(defaults, **{k: v for k, v in copied.items() if k in arguments}))
        groups.append(copied)
    ours = cls(groups, **dict(defaults, **options))
    if optimizer.state:
        ours.load_state_dict(optimizer.state_dict())
    return ours
