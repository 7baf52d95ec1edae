"""Checkpoints between an fp32 model (stock torch.optim) and a half model with fp32 masters."""
import copy
from typing import Any, Mapping, Optional

import torch

from fused_amp.optim import _memory
from fused_amp.optim._memory import master_of


def export_fp32(model: torch.nn.Module, optimizer) -> torch.nn.Module:
    """An fp32 copy of ``model`` whose parameters hold the optimizer's fp32 masters.

    Parameters without a master (fp32 ones, or not yet stepped) are copied and converted.
    The copy's ``parameters()`` come in the same order as the model's, so a ``torch.optim``
    optimizer built over them in the same groups loads ``optimizer.state_dict()`` directly::

        model32 = fused_amp.optim.export_fp32(model, opt)
        torch_opt = torch.optim.Adam(model32.parameters(), lr=1e-3)
        torch_opt.load_state_dict(opt.state_dict())

    :func:`import_fp32` goes the other way.
    """
    model32 = copy.deepcopy(model).float()
    with torch.no_grad():
        for p, p32 in zip(model.parameters(), model32.parameters()):
            master = master_of(p, optimizer.state.get(p, {}))
            if master is not None:
                p32.copy_(master)
    return model32


def import_fp32(model: torch.nn.Module, optimizer, model_state_dict: Mapping[str, Any],
                optimizer_state_dict: Optional[Mapping[str, Any]] = None, strict: bool = True) -> None:
    """Load an fp32 model's state dict into a half ``model`` and its optimizer's masters: the
    inverse of :func:`export_fp32`.

    ``model.load_state_dict`` alone rounds every weight to the param's dtype, and the masters
    then start from the rounded weights (a bf16 weight keeps 8 of fp32's 24 significant bits).
    Here each fp32 weight becomes the master of its param as it is, bitwise (with
    ``master_weights="remainder8"``: rounded to 24 bits, to nearest even, as any fp32 master
    loaded into that mode), and the param what the optimizer's step would write from that
    master. Params without a master (fp32 params, ``master_weights=False``) and buffers are
    loaded as ``model.load_state_dict(model_state_dict, strict)`` loads them. With
    ``optimizer_state_dict`` (of this optimizer or of the matching ``torch.optim`` one) the
    optimizer loads it before the masters are set, so a run resumes from an fp32 checkpoint
    with::

        fused_amp.optim.import_fp32(model, opt, ckpt["model"], ckpt["optimizer"])

    Raises ``KeyError`` for a weight of a param with a master that ``model_state_dict`` lacks,
    and ``ValueError`` for one whose shape differs, before anything is loaded; then the model
    loads (raising as ``model.load_state_dict`` raises), then the optimizer.
    """
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    masters = []
    for name, p in model.named_parameters():
        group = groups.get(id(p))
        if group is None or p.dtype == torch.float32 or _memory.master_kind(group) is None:
            continue
        if name not in model_state_dict:
            raise KeyError(f"import_fp32: model_state_dict has no {name!r}, the weight of a param "
                           "with a master")
        value = model_state_dict[name]
        if not isinstance(value, torch.Tensor) or value.shape != p.shape:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"import_fp32: model_state_dict[{name!r}] is {shape}, the param is "
                             f"{tuple(p.shape)}")
        masters.append((p, group, value))
    model.load_state_dict(model_state_dict, strict=strict)
    if optimizer_state_dict is not None:
        optimizer.load_state_dict(optimizer_state_dict)  # which drops the masters it had
    with torch.no_grad():
        for p, group, value in masters:
            state = optimizer.state[p]
            for key in _memory.MASTER_KEYS:
                state.pop(key, None)
            master = torch.empty_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
            state[_memory.MASTER] = master.copy_(value)
            _memory.bring_master(p, group, state)  # to the group's form; the param is its high half
            if _memory.MASTER in state:
                p.copy_(state[_memory.MASTER])  # rounded to nearest even, as the step writes it
