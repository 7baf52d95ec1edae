"""Lightning's Trainer with our optimizers (and scaler): Lightning refuses its own gradient
clipping for optimizers that handle the loss scale, so clipping comes from max_grad_norm."""
import importlib.util
import os

import pytest
import torch

import fused_amp

pytest.importorskip("lightning")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_NORM = 0.5
STEPS = 8


def fit(*args, **kw):
    """examples/lightning_train.py's fit (which the example's own main runs too)."""
    spec = importlib.util.spec_from_file_location(
        "lightning_train", os.path.join(ROOT, "examples", "lightning_train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fit(*args, steps=STEPS, **kw)


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


def test_the_example_runs():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "lightning_train.py"),
                          "--steps", "4"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "16-mixed: 4 steps" in out.stdout
