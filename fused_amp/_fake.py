"""Fake (meta) kernels of the ops, for torch.compile and meta tensors.

The ops mutate their arguments and return nothing, so a fake kernel has no shapes to compute;
it still refuses tensors on mixed devices, which no real kernel is reached for."""
import torch


def _check_one_device(op, arg_names, args):
    device = None
    for name, a in zip(arg_names, args):
        items = list(enumerate(a)) if isinstance(a, (list, tuple)) else [(None, a)]
        for i, t in items:
            if not isinstance(t, torch.Tensor):
                continue
            device = device or t.device
            if t.device != device:
                where = name if i is None else f"{name}[{i}]"
                raise ValueError(f"{op}: {where} is on {t.device} but the tensors are on {device}; "
                                 "all tensors must be on one device")


def register(op_names):
    for op in op_names:
        schema = getattr(torch.ops.fused_amp, op).default._schema
        arg_names = [a.name for a in schema.arguments if not a.kwarg_only]

        def fake(*args, _op=op, _names=arg_names, **kwargs):
            _check_one_device(_op, _names, args)

        torch.library.register_fake(f"fused_amp::{op}")(fake)
