"""Fake (meta) kernels of the ops, for torch.compile and meta tensors.

The ops mutate their arguments and return nothing, so a fake kernel has no shapes to compute;
it refuses what the real kernels refuse before the dispatcher could pick one: tensors on more
than one device, keyword tensors (``inv_scale``, ``found_inf``, ``lr_tensor``) included. Only
``lr_tensor`` may sit on the CPU, as the real kernels allow."""
import torch

_MAY_BE_ON_CPU = ("lr_tensor",)


def _named_tensors(arg_names, args, kwargs):
    for name, a in list(zip(arg_names, args)) + list(kwargs.items()):
        items = list(enumerate(a)) if isinstance(a, (list, tuple)) else [(None, a)]
        for i, t in items:
            if isinstance(t, torch.Tensor):
                yield (name if i is None else f"{name}[{i}]"), name, t


def check_one_device(op, arg_names, args, kwargs):
    device = None
    for where, name, t in _named_tensors(arg_names, args, kwargs):
        if name in _MAY_BE_ON_CPU and t.device.type == "cpu":
            continue
        device = device or t.device
        if t.device != device:
            raise ValueError(f"{op}: {where} is on {t.device} but the tensors are on {device}; "
                             "all tensors must be on one device")


def register(op_names):
    for op in op_names:
        schema = getattr(torch.ops.fused_amp, op).default._schema
        arg_names = [a.name for a in schema.arguments]

        def fake(*args, _op=op, _names=arg_names, **kwargs):
            check_one_device(_op, _names, args, kwargs)

        torch.library.register_fake(f"fused_amp::{op}")(fake)
