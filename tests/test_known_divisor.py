"""Adam's division by its bias correction sqrt(1 - beta2^t), a divisor known before the loop, is a
multiply and two FMAs (ops/common.h's div_by_): it must round as the division does. Adam on fp32
params steps bit for bit as torch's fused Adam over second moments of every binade (subnormal
ones too), zeros, infs and NaNs, at the steps whose corrections differ most, and with a beta2
within 2^-45 of 1, whose correction (2^-22.5 at the first step) is among the smallest a beta2
below 1 gives. tools/known_divisor_check.sh checks the division alone over whole binades."""
import pytest
import torch

import fused_amp
from helpers import assert_bitwise_equal

N = 1 << 16


def second_moments(gen):
    """v of every fp32 binade, subnormals included, and zero."""
    exponents = torch.randint(-149, 128, (N,), generator=gen).to(torch.float64)
    v = (torch.rand(N, generator=gen, dtype=torch.float64) + 1.0) * torch.exp2(exponents)
    v = v.clamp(max=torch.finfo(torch.float32).max).to(torch.float32)
    v[:6] = torch.tensor([0.0, 2.0**-149, 2.0**-126, 1.0, 2.0**64, 2.0**127])
    return v


@pytest.mark.parametrize("beta2", [0.999, 0.95, 1 - 2.0**-45])
@pytest.mark.parametrize("step", [1, 2, 10, 1000])
@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
def test_adam_divides_by_its_bias_correction_as_torch(cls, step, beta2):
    gen = torch.Generator().manual_seed(step)
    param = torch.randn(N, generator=gen)
    grad = torch.randn(N, generator=gen) * torch.exp2(torch.randint(-60, 20, (N,), generator=gen).float())
    grad[::7] = 0.0  # v' = beta2 v alone
    # v' inf and NaN (loaded moments are finite), and inf while m stays finite (m / inf is 0)
    grad[:4] = torch.tensor([float("inf"), float("nan"), 0.0, 2.0**70])
    state = {"step": torch.tensor(float(step - 1)), "exp_avg": torch.randn(N, generator=gen),
             "exp_avg_sq": second_moments(gen)}
    kw = dict(lr=1e-3, betas=(0.9, beta2), weight_decay=0.01)
    stepped = []
    for make in (lambda ps: cls(ps, fused=True, **kw), lambda ps: getattr(fused_amp.optim, cls.__name__)(ps, **kw)):
        p = torch.nn.Parameter(param.clone())
        opt = make([p])
        opt.load_state_dict({"state": {0: {k: v.clone() for k, v in state.items()}},
                             "param_groups": opt.state_dict()["param_groups"]})
        p.grad = grad.clone()
        opt.step()
        stepped.append((p.detach(), opt.state[p]["exp_avg_sq"]))
    (want, want_v), (got, got_v) = stepped
    assert_bitwise_equal(got_v, want_v, "exp_avg_sq")
    assert_bitwise_equal(got, want, "param")
