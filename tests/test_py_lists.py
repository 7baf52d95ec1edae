"""The C passes over a step's Python lists (csrc/py_lists.h): what each returns is what the Python
it replaces would give, through __torch_function__ and torch-function modes too; bad input
raises TypeError, never crashes."""
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

from fused_amp import _C
from fused_amp.optim._grad_norm import DTensor


def params_with_grads(n=3, dtype=torch.float32):
    params = [torch.nn.Parameter(torch.randn(4, dtype=dtype)) for _ in range(n)]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


class GradSwappingTensor(torch.Tensor):
    """A subclass whose __torch_function__ answers ``.grad`` with another tensor."""
    replacement = torch.full((4,), 7.0)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func == torch.Tensor.grad.__get__:
            return cls.replacement
        return super().__torch_function__(func, types, args, kwargs or {})


class GradSwappingMode(TorchFunctionMode):
    replacement = torch.full((4,), 3.0)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func == torch.Tensor.grad.__get__:
            return self.replacement
        return func(*args, **(kwargs or {}))


def test_local_grads_of_plain_params_are_their_grads():
    params = params_with_grads()
    params[1].grad = None
    grads, specs, sharded, device, refs, spec_of = _C.local_grads(params, DTensor)
    assert [g is p.grad for g, p in zip(grads, params)] == [True] * 3
    assert (specs, sharded, device, refs, spec_of) == ([], 0, torch.device("cpu"), None, [None] * 3)


def test_local_grads_device_is_none_for_sparse_or_mixed_devices():
    params = params_with_grads()
    params[0].grad = params[0].grad.to_sparse()
    assert _C.local_grads(params, DTensor)[3] is None
    params = params_with_grads()
    params[2] = torch.nn.Parameter(torch.empty(4, device="meta"))
    params[2].grad = torch.empty(4, device="meta")
    assert _C.local_grads(params, DTensor)[3] is None
    assert _C.local_grads([], DTensor) == ([], [], 0, None, None, [])


def test_local_grads_follows_torch_function_of_a_subclass_and_of_modes():
    """Where Python's ``p.grad`` would go through __torch_function__, so does local_grads."""
    plain = params_with_grads(1)[0]
    sub = torch.Tensor._make_subclass(GradSwappingTensor, torch.randn(4), True)
    assert sub.grad is GradSwappingTensor.replacement
    grads = _C.local_grads([plain, sub], DTensor)[0]
    assert grads[0] is plain.grad and grads[1] is GradSwappingTensor.replacement
    with GradSwappingMode():
        assert plain.grad is GradSwappingMode.replacement
        assert _C.local_grads([plain], DTensor)[0][0] is GradSwappingMode.replacement


def test_hold_refs_holds_a_reference_until_released():
    """While held, a tensor's Python object is kept by its C++ reference too (torch >= 2.10: the
    count moves with the C++ references); released with the holder."""
    t = torch.randn(3)
    before = sys.getrefcount(t)
    held = _C.hold_refs([t, None])
    assert sys.getrefcount(t) >= before
    del held
    assert sys.getrefcount(t) == before


@pytest.mark.parametrize("call,match", [
    (lambda: _C.hold_refs([torch.ones(1), 3]), r"tensors\[1\] is int"),
    (lambda: _C.hold_refs(5), "not iterable"),
    (lambda: _C.local_grads((torch.ones(1),), DTensor), "params must be a list"),
    (lambda: _C.local_grads([torch.ones(1), "x"], DTensor), r"params\[1\] is str"),
    (lambda: _C.local_grads([], 3), "dtensor_type must be a type"),
    (lambda: _C.lists_unchanged([], {}, None, ([], None, [], ("a",), [])), "lists as long as"),
    (lambda: _C.lists_unchanged([], {}, None, ([1], None, [], (), [])), "lists as long as"),
    (lambda: _C.lists_unchanged([], [], None, ([], None, [], (), [])), "state a dict"),
])
def test_bad_input_raises_type_error(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_lists_unchanged_notices_every_change():
    params = params_with_grads()
    state = {p: {"a": torch.zeros(1), "b": None} for p in params}
    dicts = [state[p] for p in params]
    held = lambda: (list(params), None, list(dicts), ("a", "b", "c"),  # noqa: E731
                    [[d.get(k) for d in dicts] for k in ("a", "b", "c")])
    kept = held()
    assert _C.lists_unchanged(params, state, DTensor, kept)
    assert not _C.lists_unchanged(params[::-1], state, DTensor, kept)
    assert not _C.lists_unchanged(params[:2], state, DTensor, kept)
    state[params[1]]["a"] = torch.zeros(1)  # a replaced entry
    assert not _C.lists_unchanged(params, state, DTensor, kept)
    kept = held()
    state[params[2]]["c"] = torch.zeros(1)  # a new one
    assert not _C.lists_unchanged(params, state, DTensor, kept)
    kept = held()
    del state[params[0]]["a"]  # a deleted one
    assert not _C.lists_unchanged(params, state, DTensor, kept)
    kept = held()
    state[params[0]] = dict(state[params[0]])  # a replaced state dict
    assert not _C.lists_unchanged(params, state, DTensor, kept)
    del state[params[0]]
    assert not _C.lists_unchanged(params, state, DTensor, kept)
