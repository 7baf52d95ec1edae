"""Lightning's Trainer with our optimizers (and scaler): Lightning refuses its own gradient
clipping for optimizers that handle the loss scale, so clipping comes from max_grad_norm."""
import warnings

import pytest
import torch

import fused_amp

L = pytest.importorskip("lightning")
from lightning.pytorch.plugins import MixedPrecision  # noqa: E402

MAX_NORM = 0.5
STEPS = 8


class TinyModule(L.LightningModule):
    def __init__(self, make_optimizer):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        self.make_optimizer = make_optimizer

    def training_step(self, batch, _):
        x, y = batch
        return ((self.net(x).float() - y) ** 2).sum()

    def configure_optimizers(self):
        return self.make_optimizer(self.parameters())


def fit(precision, make_optimizer, scaler=None, clip_val=None):
    gen = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(8 * STEPS, 16, generator=gen),
                                          torch.randn(8 * STEPS, 4, generator=gen))
    module = TinyModule(make_optimizer)
    precision_kw = (dict(plugins=[MixedPrecision(precision, "cpu", scaler=scaler)]) if scaler is not None
                    else dict(precision=precision))
    trainer = L.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, gradient_clip_val=clip_val, **precision_kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    return torch.cat([p.detach().flatten() for p in module.parameters()]), trainer.optimizers[0]


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_trainer_clips_through_max_grad_norm_as_lightning_clips_torchs(precision):
    """Our AdamW with max_grad_norm (and, for 16-mixed, our GradScaler in Lightning's
    MixedPrecision plugin) against torch's AdamW with Lightning's gradient_clip_val: within the
    spread of torch's own foreach and per-tensor AdamW under the same clipping (at least 4 fp32
    ulps), and every step clipped."""
    scaler = (lambda cls: cls("cpu", init_scale=2.0 ** 10)) if precision == "16-mixed" else (lambda cls: None)
    ours, opt = fit(precision, lambda ps: fused_amp.optim.AdamW(ps, lr=1e-2, max_grad_norm=MAX_NORM),
                    scaler(fused_amp.GradScaler))
    ref = [fit(precision, lambda ps, f=f: torch.optim.AdamW(ps, lr=1e-2, foreach=f),
               scaler(torch.amp.GradScaler), clip_val=MAX_NORM)[0] for f in (True, False)]
    unclipped, _ = fit(precision, lambda ps: fused_amp.optim.AdamW(ps, lr=1e-2), scaler(fused_amp.GradScaler))
    spread = max((ref[0] - ref[1]).abs().max().item(), 4 * torch.finfo(torch.float32).eps * ref[0].abs().max().item())
    assert (ours - ref[0]).abs().max().item() <= spread
    assert (unclipped - ref[0]).abs().max().item() > 100 * spread  # clipping did change the run
    assert opt.last_grad_norm.item() > MAX_NORM
    assert opt.state[next(iter(opt.param_groups[0]["params"]))]["step"].item() == STEPS
