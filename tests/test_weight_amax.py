"""The step's weight amax (fp8 scaling, ops.step_'s ``weight_amax``): for every optimizer of the
registry and every storage kind, each param's amax after the step is bitwise torch's
``_foreach_norm(params, inf)`` of the params it wrote, the read that torchao's
precompute_float8_dynamic_scale_for_fsdp makes, with the work split over threads or not; an
overflow step leaves it as it was. (The CUDA kernel's, under the emulator: test_cuda_sim.py.)"""
import math

import pytest
import torch

from fused_amp import ops
from helpers import assert_bitwise_equal
from optim_registry import CASES, IDS, STORAGE

# vector bodies, scalar tails, a quant block's edge, and one param that two threads split
SIZES = [1, 33, 257, 4099, 70000]


def torch_amax(params):
    return torch.stack(torch._foreach_norm([p.detach() for p in params], ord=math.inf)).float()


def steps_with_amax(opt, params, grads, amax, found_infs):
    """Steps ``opt`` once per ``found_infs`` value (as a GradScaler would set found_inf), asking
    the cached lists of its step for the weight amax into ``amax``; yields after each step."""
    for found in found_infs:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.found_inf = torch.tensor(found)
        opt.grad_scale = torch.tensor(1.0)
        opt.step()
        yield found
        # the first step built (and cached) the lists; the next ones take the amax buffer
        # (and the op's parts, formed from them once: _base._op_parts, formed again)
        for lists, _ in opt._lists.groups[0].by_device.values():
            lists["weight_amax"] = amax
            lists.pop("op_parts", None)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("storage", list(STORAGE))
@pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)
def test_the_step_writes_torchs_amax_of_the_params_it_wrote(cls, torch_cls, kw, storage, threads):
    dtype, options = STORAGE[storage]
    gen = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter((torch.randn(n, generator=gen) * 3).to(dtype)) for n in SIZES]
    grads = [torch.randn(n, generator=gen).to(dtype) for n in SIZES]
    opt = cls(params, **kw, **options)
    amax = torch.full((len(params),), -1.0)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for i, found in enumerate(steps_with_amax(opt, params, grads, amax, [0.0, 0.0, 0.0, 1.0, 0.0])):
            if i == 0:
                continue  # (the first step built the lists)
            expected = torch_amax(params)
            assert_bitwise_equal(amax, expected, f"step {i}")
            if found:  # nothing written: still the amax of the last clean step, which is this one's
                assert_bitwise_equal(amax, before)
            before = expected.clone()
    finally:
        torch.set_num_threads(previous)


SGD_PLAIN = dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False)


@pytest.mark.parametrize("dtype,master", [(torch.bfloat16, True), (torch.bfloat16, "remainder8"),
                                          (torch.float32, False)])
def test_the_amax_is_found_wherever_it_falls(dtype, master):
    """The largest element at each place of a param: every lane of a vector, the scalar head
    before an aligned vector (streaming stores) and the tail after the last whole one."""
    n = 77
    for where in range(n):
        param = torch.linspace(-1, 1, n).to(dtype)
        param[where] = -3.0
        masters = [param.float()] if master is True else []
        if master == "remainder8":
            masters = [torch.zeros(n, dtype=torch.uint8)]
        amax = torch.zeros(1)
        ops.step_("sgd", [param[1:]], [torch.zeros(n - 1, dtype=dtype)], [m[1:] for m in masters], [],
                  [torch.zeros(1)], lr=0.0, hyper=SGD_PLAIN, weight_amax=amax)  # (from element 1: unaligned)
        assert amax.item() == (3.0 if where > 0 else 1.0), where


@pytest.mark.parametrize("special", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("dtype,master", [(torch.bfloat16, True), (torch.bfloat16, "remainder"),
                                          (torch.float16, True), (torch.float32, False)])
def test_an_inf_or_nan_param_gives_torchs_amax(special, dtype, master):
    """inf where a param is inf; NaN where one is NaN, as torch's max(abs) gives, wherever the
    element falls (a vector body or a scalar tail)."""
    for where in (5, 40):
        params = [torch.linspace(-2, 2, 45).to(dtype), torch.linspace(-1, 1, 45).to(dtype)]
        params[0][where] = special
        grads = [torch.zeros_like(p) for p in params]
        masters = [p.float() for p in params] if master is True else []
        if master == "remainder":
            masters = [torch.zeros(p.shape, dtype=torch.int16) for p in params]
        amax = torch.zeros(2)
        ops.step_("sgd", params, grads, masters, [], [torch.zeros(1) for _ in params], lr=0.1,
                  hyper=SGD_PLAIN, weight_amax=amax)
        assert_bitwise_equal(amax, torch_amax(params))


@pytest.mark.parametrize("bad,message", [
    (torch.zeros(2, dtype=torch.float64), "weight_amax must be float32"),
    (torch.zeros(3), "one element per param"),
    (torch.zeros(1, 2), "one element per param"),
    (torch.zeros(4)[::2], "one element per param"),
])
def test_a_bad_weight_amax_is_refused_before_anything_is_written(bad, message):
    params = [torch.ones(5, dtype=torch.bfloat16), torch.ones(7, dtype=torch.bfloat16)]
    masters = [p.float() for p in params]
    before = [p.clone() for p in params + masters]
    with pytest.raises((ValueError, TypeError), match=message):
        ops.step_("sgd", params, [torch.ones_like(p) for p in params], masters, [], [torch.zeros(1)] * 2,
                  lr=0.1, hyper=SGD_PLAIN, weight_amax=bad)
    for a, b in zip(params + masters, before):
        assert_bitwise_equal(a, b)


def test_an_optimizer_that_writes_outputs_refuses_weight_amax():
    p = torch.ones(8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weight_amax is for optimizers that write their params"):
        ops.step_("muon_momentum", [p], [torch.ones_like(p)], [], [[torch.zeros(8)]], [],
                  outputs=[torch.empty_like(p)], lr=0.0,
                  hyper={h: 0.0 for h in ops.optimizers()["muon_momentum"]["hyper"]}, weight_amax=torch.zeros(1))
