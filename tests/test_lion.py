"""Lion's own claims (the generic tests cover it through optim_registry): fp32 masters bitwise
equal to the paper's update written with torch's tensor ops, sign(0) = 0, and the bytes each
memory mode holds."""
import pytest
import torch

from fused_amp.optim import Lion
from helpers import assert_bitwise_equal
from reference_optim import ReferenceLion

SHAPES = [(64, 33), (1000,), (7,), (3, 5, 9)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kw", [dict(lr=1e-3), dict(lr=1e-2, betas=(0.95, 0.98), weight_decay=0.1, maximize=True)])
def test_masters_are_bitwise_the_reference(dtype, kw):
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen).to(dtype) for s in SHAPES]
    ours = [torch.nn.Parameter(x.clone()) for x in init]
    theirs = [torch.nn.Parameter(x.float()) for x in init]
    opt, ref = Lion(ours, **kw), ReferenceLion(theirs, **kw)
    for _ in range(50):
        for p, q in zip(ours, theirs):
            p.grad = torch.randn(p.shape, generator=gen).to(dtype)
            q.grad = p.grad.float()
        opt.step()
        ref.step()
    for p, q in zip(ours, theirs):
        master = opt.state[p]["master_param"] if dtype != torch.float32 else p.detach()
        assert_bitwise_equal(master, q.detach())
        assert_bitwise_equal(opt.state[p]["exp_avg"], ref.state[q]["exp_avg"])


def test_a_zero_direction_moves_nothing():
    p = torch.nn.Parameter(torch.randn(100))
    before = p.detach().clone()
    opt = Lion([p], lr=0.1)
    p.grad = torch.zeros_like(p)
    opt.step()  # m = 0 and g = 0: sign(0) = 0
    assert_bitwise_equal(p.detach(), before)


@pytest.mark.parametrize("options,per_param", [
    (dict(), 8), (dict(master_weights="remainder", state_dtype=torch.bfloat16), 4),
    (dict(master_weights="remainder", state_dtype=torch.uint8), 3 + 4 / 256),
    (dict(master_weights="remainder8", state_dtype=torch.uint8), 2 + 4 / 256)])
def test_state_bytes_of_each_memory_mode(options, per_param):
    """Optimizer-side bytes per bf16 param (with the param and grad, 4 more): fp32 master and
    exp_avg 8; remainder + bf16 exp_avg 4 (8 in all); remainder + 8-bit 3 (7); 24-bit + 8-bit 2 (6)."""
    p = torch.nn.Parameter(torch.randn(256 * 64).bfloat16())
    opt = Lion([p], **options)
    p.grad = torch.randn_like(p)
    opt.step()
    held = sum(t.numel() * t.element_size() for k, t in opt.state[p].items() if k != "step")
    assert held == per_param * p.numel()
