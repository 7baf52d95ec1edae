"""fused_amp.check_model: every kind of finding comes with a test that the failure it predicts
happens in torch; healthy models give no findings."""
import pytest
import torch

import fused_amp


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4))


def test_healthy_models_give_no_findings():
    for dtype in (torch.float16, torch.bfloat16):
        model = mlp()
        assert fused_amp.check_model(model, dtype) == []
        assert fused_amp.check_model(model, dtype, fused_amp.optim.AdamW(model.parameters())) == []
        assert fused_amp.check_model(model, dtype, torch.optim.SGD(model.parameters(), lr=0.1)) == []
        assert fused_amp.check_model(model, dtype, example_input=torch.randn(4, 8), init_scale=2.0 ** 16,
                                     loss_fn=lambda out: out.float().pow(2).mean()) == []
    assert fused_amp.check_model(model, torch.float16, torch.optim.Adam(model.parameters(), fused=True)) == []
    # torch's Adam at its default lr 1e-3 on bf16 weights: the LayerNorm gains (1.0, half a bf16
    # ulp 2^-8 above lr) never move, the one finding; eps 1e-8 is representable in bf16 (and
    # LayerNorm's eps is never one)
    for fused in (True, False):
        model = mlp().bfloat16() if not fused else mlp()
        findings = fused_amp.check_model(model, torch.bfloat16, torch.optim.Adam(model.parameters(), fused=fused))
        assert [(f.kind, "1.weight" in f.where) for f in findings] == [("update-vanishes", True)]


def test_eps_that_vanishes_in_fp16_is_found_and_torch_really_gives_nan():
    model = mlp().half()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # eps=1e-8: 0 in fp16
    findings = fused_amp.check_model(model, torch.float16, opt)
    assert [f.kind for f in findings] == ["eps-vanishes"]
    line = str(findings[0])
    assert "Adam param group 0" in line and "0/0 = NaN" in line and "fused_amp.optim" in line
    assert "\n" not in line
    # what it predicts: a param whose grad is 0 gets NaN from torch's Adam in fp16
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert all(torch.isnan(p).all() for p in model.parameters())


def test_values_beyond_the_dtype_are_found_and_become_inf():
    model = mlp()
    with torch.no_grad():
        model[0].weight[0, 0] = 1e5  # beyond fp16's 65504, fine in bf16
    model.register_buffer("big", torch.tensor([7e4]))
    findings = fused_amp.check_model(model, torch.float16)
    assert {f.where for f in findings} == {"param 0.weight", "buffer big"}
    assert all(f.kind == "overflows-dtype" for f in findings)
    assert fused_amp.check_model(model, torch.bfloat16) == []
    assert torch.isinf(model[0].weight.half()).any() and torch.isinf(model.big.half()).all()


def test_init_scale_that_overflows_the_first_backward_is_found():
    model, x = mlp(), torch.randn(64, 8) * 30
    findings = fused_amp.check_model(model, torch.float16, example_input=x, init_scale=2.0 ** 24)
    assert [f.kind for f in findings] == ["init-scale-overflows"]
    # what it predicts: the scaled backward in fp16 gives inf grads (the step is skipped)
    half = mlp().half()
    (half(x.half()).float().sum() * 2.0 ** 24).backward()
    assert any(not torch.isfinite(p.grad).all() for p in half.parameters())
    assert fused_amp.check_model(model, torch.float16, example_input=x, init_scale=1.0) == []


def test_a_forward_that_already_overflows_is_found():
    model, x = mlp(), torch.full((2, 8), 3e4)
    with torch.no_grad():
        model[0].weight.fill_(1.0)
    findings = fused_amp.check_model(model, torch.float16, example_input=x, init_scale=1.0,
                                     loss_fn=lambda out: out.float().sum())
    assert findings and findings[0].kind == "loss-not-finite"
    with torch.no_grad():  # what it predicts: torch's fp16 forward gives a non-finite loss
        assert not torch.isfinite(model.half()(x.half()).float().sum())


def test_dtype_must_be_half():
    with pytest.raises(ValueError, match="dtype must be"):
        fused_amp.check_model(mlp(), torch.float32)


class HandRMSNorm(torch.nn.Module):
    """An RMSNorm as often written by hand: computed in the input's dtype."""

    def __init__(self, dim, eps=1e-8):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def test_a_module_eps_that_vanishes_where_the_module_computes_in_half_is_found():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), HandRMSNorm(16), torch.nn.Linear(16, 4))
    findings = fused_amp.check_model(model, torch.float16)
    assert [(f.kind, f.where) for f in findings] == [("eps-vanishes", "module 1 (HandRMSNorm.eps)")]
    assert "\n" not in str(findings[0])
    assert fused_amp.check_model(model, torch.bfloat16) == []  # 1e-8 is a bf16 value
    # what it predicts: a zero row (a padding position, a dead unit's output) becomes NaN in fp16
    x = torch.randn(3, 16)
    x[1] = 0.0
    with torch.no_grad():
        assert torch.isfinite(model[1](x)).all()
        assert torch.isnan(model[1].half()(x.half())[1]).all()


def test_torchs_norm_layers_compute_in_fp32_and_are_never_reported():
    """Their eps is a double applied in fp32 (LayerNorm, GroupNorm, BatchNorm, RMSNorm): even
    eps=1e-8, 0 in fp16, gives finite output in fp16, so no finding."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16, eps=1e-8),
                                torch.nn.BatchNorm1d(16, eps=1e-8), torch.nn.RMSNorm(16, eps=1e-8),
                                torch.nn.Linear(16, 4))
    assert fused_amp.check_model(model.eval(), torch.float16) == []
    with torch.no_grad():
        for layer in list(model)[1:4]:
            assert torch.isfinite(layer.half()(torch.zeros(2, 16).half())).all()


def test_updates_that_vanish_are_found_and_torch_really_stalls():
    """torch's AdamW at lr 1e-5 on bf16 weights of N(0, 1): each update is about lr, below half
    a bf16 ulp for every |w| above 2^-8 (nearly all): the finding names the share, and 100 steps
    of torch's AdamW leave those weights exactly as they were. fp32 masters (ours) are healthy;
    24-bit masters are flagged to nearest only (stochastic rounding keeps the updates)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False)).bfloat16()
    with torch.no_grad():
        model[0].weight.normal_()
    before = model[0].weight.detach().clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    findings = [f for f in fused_amp.check_model(model, torch.bfloat16, opt) if f.kind == "update-vanishes"]
    assert len(findings) == 1 and "0.weight" in findings[0].where and findings[0].value == 1e-5
    w = before.float().abs()
    lost = (w > 0) & (torch.ldexp(torch.ones_like(w), torch.frexp(w)[1] - 9) > 1e-5)
    assert f"{lost.float().mean().item():.0%} of its elements" in findings[0].problem
    assert lost.float().mean() > 0.95
    for _ in range(100):
        opt.zero_grad()
        model(torch.randn(8, 64).bfloat16()).float().pow(2).mean().backward()
        opt.step()
    after = model[0].weight.detach()
    assert torch.equal(after[lost], before[lost])  # the stall, for real
    assert not torch.equal(after[~lost], before[~lost])  # the tiny weights do move
    ours = fused_amp.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    assert not [f for f in fused_amp.check_model(model, torch.bfloat16, ours) if f.kind == "update-vanishes"]
    nearest = fused_amp.optim.AdamW(model.parameters(), lr=1e-5, master_weights="remainder8",
                                    stochastic_rounding=False)
    found = [f for f in fused_amp.check_model(model, torch.bfloat16, nearest) if f.kind == "update-vanishes"]
    assert len(found) == 1 and "24-bit" in found[0].problem and "stochastic" in found[0].fix
    stochastic = fused_amp.optim.AdamW(model.parameters(), lr=1e-5, master_weights="remainder8")
    assert not [f for f in fused_amp.check_model(model, torch.bfloat16, stochastic) if f.kind == "update-vanishes"]
    plain = fused_amp.optim.AdamW(model.parameters(), lr=1e-5, master_weights=False)
    assert [f for f in fused_amp.check_model(model, torch.bfloat16, plain) if f.kind == "update-vanishes"]
