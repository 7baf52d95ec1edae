"""fused_amp._C.call_step, the step op called from C++ through the dispatcher (csrc/py_step.h):
what a user sees of the op is what torch.ops shows, and it falls back to torch.ops where only
its Python binding handles a call."""
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import fused_amp._C as _C
import fused_amp.optim

HYPER = [0.9, 0.999, 1e-8, 0.01, 1.0, 0.0, 0.0, 1e-3, 0.0]  # adam's, then lr and max_grad_norm


def adam_parts(seed=0, n=100):
    gen = torch.Generator().manual_seed(seed)
    param, grad = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    return ("adam", [param], [grad], [], [torch.zeros(n), torch.zeros(n)], [torch.zeros(())], [], [], [], [], [],
            HYPER, [None] * 4, [], True)


def torch_ops_step(parts):
    optimizer, params, grads, masters, states, steps, *rest = parts
    names = ("state_absmaxes", "scalar_states", "outputs", "epilogues", "epilogue_layout", "hyper", "scalars",
             "rounding", "unscale_grads")
    torch.ops.fused_amp.step_.default(optimizer, params, grads, masters, states, steps, **dict(zip(names, rest)))


def written(parts):
    return [t.clone() for t in parts[1] + parts[4] + parts[5]]


def test_same_bits_and_versions_as_torch_ops():
    ours, theirs = adam_parts(), adam_parts()
    for _ in range(3):
        assert _C.call_step(False, *ours) is None
        torch_ops_step(theirs)
    for a, b in zip(written(ours), written(theirs)):
        assert torch.equal(a, b)
    for a, b in zip(ours[1] + ours[4] + ours[5], theirs[1] + theirs[4] + theirs[5]):
        assert a._version == b._version > 0


def test_the_check_writes_nothing_and_refuses_as_the_op():
    parts = adam_parts()
    before = written(parts)
    assert _C.call_step(True, *parts) is None
    assert all(torch.equal(a, b) for a, b in zip(before, written(parts)))
    bad = list(parts)
    bad[2] = [torch.randn(3)]  # a grad of another shape
    with pytest.raises(ValueError, match=r"step_\(adam\): grads\[0\] has shape"):
        _C.call_step(True, *bad)
    with pytest.raises(TypeError, match=r"call_step: grads\[0\] is float, not a Tensor"):
        _C.call_step(False, *(parts[:2] + ([1.0],) + parts[3:]))
    assert all(torch.equal(a, b) for a, b in zip(before, written(parts)))


def test_a_tensor_with_its_own_torch_function_goes_back_to_torch_ops():
    class Traced(torch.Tensor):  # torch.Tensor's __torch_function__: torch.ops' binding calls it
        pass

    parts = list(adam_parts())
    parts[1] = [parts[1][0].as_subclass(Traced)]
    before = written(parts)
    assert _C.call_step(False, *parts) is NotImplemented
    assert all(torch.equal(a, b) for a, b in zip(before, written(parts)))  # (nothing done)


def stepped_optimizer():
    gen = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(100, generator=gen))
    param.grad = torch.randn(100, generator=gen)
    optimizer = fused_amp.optim.AdamW([param], lr=1e-3)
    optimizer.step()  # (its lists built and cached: the next step is the fast one)
    return optimizer, param


def test_the_profiler_records_the_op():
    optimizer, _ = stepped_optimizer()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        optimizer.step()
    assert "fused_amp::step_" in {event.name for event in prof.events()}


def recording(mode_class, hook_name):
    """A mode of ``mode_class`` whose hook records each function it sees and calls it; and the record."""
    seen = []

    def hook(self, func, types, args=(), kwargs=None):
        seen.append(func)
        return func(*args, **(kwargs or {}))

    return type("Seen", (mode_class,), {hook_name: hook})(), seen


def test_a_dispatch_mode_sees_the_op():
    mode, seen = recording(TorchDispatchMode, "__torch_dispatch__")
    optimizer, param = stepped_optimizer()
    before = param.detach().clone()
    with mode:
        optimizer.step()
    assert torch.ops.fused_amp.step_.default in seen
    assert not torch.equal(param, before)


def test_a_torch_function_mode_sees_the_op_and_the_step_is_the_same():
    mode, seen = recording(TorchFunctionMode, "__torch_function__")
    (ours, param), (plain, reference) = stepped_optimizer(), stepped_optimizer()
    with mode:
        ours.step()
    plain.step()
    assert torch.ops.fused_amp.step_ in seen  # (the op's packet, as before call_step)
    assert torch.equal(param, reference)
