"""AdEMAMix's own claims (the generic tests cover it through optim_registry): fp32 masters
bitwise equal to the paper's update written with torch's tensor ops (tests/reference_optim.py),
the warm-ups of alpha and beta3 as bitsandbytes defines them, and bitsandbytes' own AdEMAMix as
an outside check where it installs and runs on the CPU."""
import math

import pytest
import torch

from fused_amp.optim import AdEMAMix
from helpers import assert_bitwise_equal
from reference_optim import ReferenceAdEMAMix

SHAPES = [(64, 33), (1000,), (7,), (3, 5, 9)]
OPTIONS = [dict(lr=1e-3), dict(lr=1e-2, betas=(0.8, 0.99, 0.999), alpha=2.0, t_alpha=20, t_beta3=30,
                                 weight_decay=0.1, maximize=True)]


def run(make_ours, make_theirs, dtype, steps=50, seed=0):
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=gen).to(dtype) for s in SHAPES]
    ours = [torch.nn.Parameter(x.clone()) for x in init]
    theirs = [torch.nn.Parameter(x.float()) for x in init]
    opt, ref = make_ours(ours), make_theirs(theirs)
    for _ in range(steps):
        for p, q in zip(ours, theirs):
            p.grad = torch.randn(p.shape, generator=gen).to(dtype)
            q.grad = p.grad.float()
        opt.step()
        ref.step()
    return opt, ref, ours, theirs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kw", OPTIONS)
def test_masters_are_bitwise_the_reference(dtype, kw):
    opt, ref, ours, theirs = run(lambda ps: AdEMAMix(ps, **kw), lambda ps: ReferenceAdEMAMix(ps, **kw), dtype)
    for p, q in zip(ours, theirs):
        master = opt.state[p]["master_param"] if dtype != torch.float32 else p.detach()
        assert_bitwise_equal(master, q.detach())
        for key in ("m1", "m2", "nu"):
            assert_bitwise_equal(opt.state[p][key], ref.state[q][key], key)


def test_warm_ups_follow_bitsandbytes_definition():
    """alpha_t = min(t alpha / T_alpha, alpha); beta3_t interpolates ln beta3 towards ln beta1
    harmonically and reaches beta3 at T_beta3 (the closed forms, checked at their ends)."""
    group = dict(betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=100, t_beta3=100)
    alpha_1, beta3_1 = ReferenceAdEMAMix.schedules(group, 1)
    assert alpha_1 == pytest.approx(0.05)
    assert beta3_1 == pytest.approx(math.exp(math.log(0.9) * math.log(0.9999)
                                             / (0.99 * math.log(0.9999) + 0.01 * math.log(0.9))))
    assert ReferenceAdEMAMix.schedules(group, 100) == pytest.approx((5.0, 0.9999))
    assert ReferenceAdEMAMix.schedules(group, 1000) == pytest.approx((5.0, 0.9999))


def test_bitsandbytes_ademamix_agrees_where_it_runs():
    """bitsandbytes' 32-bit AdEMAMix (its own kernels) on fp32 params against ours: the same
    update within what two fp32 implementations of it differ by after 20 steps."""
    bnb = pytest.importorskip("bitsandbytes")
    kw = dict(lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, weight_decay=1e-2)
    try:
        opt, ref, ours, theirs = run(lambda ps: AdEMAMix(ps, **kw), lambda ps: bnb.optim.AdEMAMix(ps, **kw),
                                     torch.float32, steps=20)
    except (RuntimeError, NotImplementedError, AttributeError) as e:  # no CPU kernel for it in this build
        pytest.skip(f"bitsandbytes' AdEMAMix does not run on this CPU: {e}")
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
