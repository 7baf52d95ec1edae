"""Fake kernels of the ops, for torch.compile.

The ops mutate their arguments and return nothing, so a fake kernel has no shapes to compute;
it raises what the real kernels raise. Devices first, since fake tensors keep theirs: tensors
on more than one device are refused, the scalar tensors (``inv_scale``, ``found_inf``,
``lr_tensor``) included, and only ``lr_tensor`` may sit on the CPU, as the real kernels allow.
Then the C++ validation itself (lengths, shapes, dtypes, overlaps, scalars, options) runs on
meta tensors of the same shapes, strides and dtypes, through ``torch.ops.fused_amp_check``:
the same schemas, whose kernels validate and do nothing else (csrc/register.cpp), so a fake
kernel refuses what a real one refuses, with its message."""
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

_MAY_BE_ON_CPU = ("lr_tensor",)
# the entries of a list argument that has one role per entry: step_'s scalars (csrc/register.cpp)
_ENTRY_NAMES = {"scalars": ("lr_tensor", "inv_scale", "found_inf", "grad_norm")}


def _named_tensors(arg_names, args, kwargs):
    for name, a in list(zip(arg_names, args)) + list(kwargs.items()):
        items = list(enumerate(a)) if isinstance(a, (list, tuple)) else [(None, a)]
        for i, t in items:
            if isinstance(t, torch.Tensor):
                if name in _ENTRY_NAMES:
                    yield _ENTRY_NAMES[name][i], _ENTRY_NAMES[name][i], t
                else:
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


def _as_meta(a):
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    if isinstance(a, (list, tuple)):
        return type(a)(_as_meta(x) for x in a)
    return a


def register(op_names):
    for op in op_names:
        arg_names = [a.name for a in getattr(torch.ops.fused_amp, op).default._schema.arguments]
        check = getattr(torch.ops.fused_amp_check, op).default

        def fake(*args, _op=op, _check=check, _names=arg_names, **kwargs):
            check_one_device(_op, _names, args, kwargs)
            with unset_fake_temporarily():
                _check(*_as_meta(args), **{k: _as_meta(v) for k, v in kwargs.items()})

        torch.library.register_fake(f"fused_amp::{op}")(fake)
