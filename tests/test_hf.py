"""The HF Trainer (and its accelerate) with our optimizer and scaler, through
examples/hf_trainer.py on a tiny GPT-2 built from a config (nothing downloaded)."""
import importlib.util
import os
import warnings

import pytest
import torch

import fused_amp

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 12


def example():
    spec = importlib.util.spec_from_file_location("hf_trainer", os.path.join(ROOT, "examples", "hf_trainer.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return example().main(steps=STEPS, **kw)


@pytest.mark.parametrize("use_cls_and_kwargs", [False, True], ids=["optimizers", "optimizer_cls_and_kwargs"])
def test_trainer_trains_bf16_params_with_our_optimizer(use_cls_and_kwargs):
    r = train(use_cls_and_kwargs=use_cls_and_kwargs)
    opt = r["optimizer"]
    assert type(opt) is fused_amp.optim.AdamW and opt.max_grad_norm == 1.0
    assert r["optimizer_steps"] == r["scheduler_steps"] == STEPS
    for p in r["model"].parameters():
        master = opt.state[p]["master_param"]
        assert p.dtype == torch.bfloat16 and master.dtype == torch.float32
        assert torch.equal(p.detach(), master.to(torch.bfloat16))
    losses = r["losses"]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.1  # it learns
    assert torch.isfinite(opt.last_grad_norm)


def test_a_skipped_step_holds_the_lr_schedule():
    """accelerate calls a step skipped only when optimizer.step() was not called: the installed
    scaler (skip_on_host) does not call it on an overflow, so the scheduler does not advance."""
    r = train(scaler=True, inf_at=4)
    assert r["optimizer_steps"] == r["scheduler_steps"] == STEPS - 1
    assert r["scale"] == 2.0 ** 9  # backed off once
    assert r["lrs"][4] == r["lrs"][3]  # the skipped step left the learning rate where it was
    assert len(set(r["lrs"])) == STEPS - 1


def test_without_skip_on_host_accelerate_misses_the_skip():
    """The trap (huggingface/accelerate#4242) that skip_on_host avoids: the optimizer skips on
    the device, accelerate sees step() called, and the schedule advances past the skipped step."""
    r = train(scaler=True, inf_at=4, skip_on_host=False)
    assert r["optimizer_steps"] == STEPS - 1 and r["scheduler_steps"] == STEPS


def test_install_grad_scaler_refuses_a_scaler_that_would_hide_skips():
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True)
    with pytest.raises(ValueError, match="skip_on_host=True"):
        fused_amp.integrations.install_grad_scaler(accelerator, fused_amp.GradScaler("cpu"))
    scaler = fused_amp.integrations.install_grad_scaler(accelerator)
    assert accelerator.scaler is scaler and scaler._skip_on_host


@pytest.mark.cuda
def test_fp16_on_a_gpu_with_our_scaler_in_place_of_accelerates():
    r = train(scaler=True, inf_at=4, fp16=True)
    assert isinstance(r["optimizer"], fused_amp.optim.AdamW)
    assert r["optimizer_steps"] == r["scheduler_steps"] < STEPS  # at least the injected skip
    assert sum(r["losses"][-3:]) < sum(r["losses"][:3])
