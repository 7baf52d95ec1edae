"""Train a tiny model with Lightning's Trainer and fused_amp: our AdamW clipping through its
own ``max_grad_norm`` (Lightning refuses its gradient clipping for optimizers that handle the
loss scale), and for fp16 our GradScaler in Lightning's MixedPrecision plugin.

    python examples/lightning_train.py [--precision 16-mixed|bf16-mixed] [--steps 8]

The essential lines:

    def configure_optimizers(self):
        return fused_amp.optim.AdamW(self.parameters(), lr=1e-2, max_grad_norm=0.5)

    plugin = MixedPrecision("16-mixed", "cuda", scaler=fused_amp.GradScaler("cuda"))
    trainer = lightning.Trainer(plugins=[plugin])   # or precision="bf16-mixed", no scaler
"""
import argparse
import warnings

import lightning as L
import torch
from lightning.pytorch.plugins import MixedPrecision

import fused_amp


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


def fit(precision, make_optimizer, scaler=None, clip_val=None, steps=8):
    """Trains ``steps`` batches of 8; returns the flat params and the optimizer. ``scaler``
    goes into a MixedPrecision plugin; ``clip_val`` is Lightning's own gradient clipping."""
    gen = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(8 * steps, 16, generator=gen),
                                          torch.randn(8 * steps, 4, generator=gen))
    module = TinyModule(make_optimizer)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    precision_kw = (dict(plugins=[MixedPrecision(precision, device, scaler=scaler)]) if scaler is not None
                    else dict(precision=precision))
    trainer = L.Trainer(max_steps=steps, accelerator=device, devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, gradient_clip_val=clip_val, **precision_kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))
    return torch.cat([p.detach().flatten().cpu() for p in module.parameters()]), trainer.optimizers[0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="16-mixed", choices=["16-mixed", "bf16-mixed"])
    parser.add_argument("--steps", type=int, default=8)
    a = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    scaler = fused_amp.GradScaler(device, init_scale=2.0 ** 10) if a.precision == "16-mixed" else None
    _, opt = fit(a.precision, lambda ps: fused_amp.optim.AdamW(ps, lr=1e-2, max_grad_norm=0.5), scaler,
                 steps=a.steps)
    print(f"{a.precision}: {a.steps} steps, last pre-clip grad norm {opt.last_grad_norm.item():.3f} "
          f"(clipped to 0.5)")
