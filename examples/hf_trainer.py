"""Train a tiny GPT-2 (built from a config: nothing is downloaded) with the HF Trainer, using
fused_amp's AdamW on bf16 params with fp32 masters and clipping inside its step, and optionally
fused_amp's GradScaler in the Trainer's accelerate (which then holds the LR schedule on skipped
steps).

    python examples/hf_trainer.py [--steps 30] [--scaler] [--inf-at STEP]

The essential lines:

    optimizer = fused_amp.optim.AdamW(model.parameters(), lr=1e-3, max_grad_norm=1.0)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, 0, steps)
    args = TrainingArguments(..., max_grad_norm=0.0)    # the optimizer clips
    trainer = Trainer(model, args, train_dataset=data, optimizers=(optimizer, scheduler))
    fused_amp.integrations.install_grad_scaler(trainer.accelerator)   # optional: a loss scale
    trainer.train()
"""
import argparse
import math
import tempfile

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import fused_amp


class TokenData(torch.utils.data.Dataset):
    """Sequences that repeat a short random pattern: a language model learns them quickly."""

    def __init__(self, n=512, length=32, vocab=128, seed=0):
        gen = torch.Generator().manual_seed(seed)
        patterns = torch.randint(0, vocab, (n, 4), generator=gen)
        self.tokens = patterns.repeat(1, length // 4)

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


class Record(TrainerCallback):
    """The loss and learning rate of every step."""

    def __init__(self):
        self.losses, self.lrs = [], []

    def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
        self.lrs.append(lr_scheduler.get_last_lr()[0])

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])


def inject_inf(model, at_step):
    """Make one step's grads overflow (backward number ``at_step``, counted from 0)."""
    calls = [0]

    def hook(grad):
        calls[0] += 1
        return grad * math.inf if calls[0] - 1 == at_step else grad

    next(model.parameters()).register_hook(hook)


def main(steps=30, scaler=False, inf_at=None, use_cls_and_kwargs=False, skip_on_host=True, fp16=False):
    """``fp16`` (a GPU): fp16 weights and the Trainer's fp16 mode, whose torch GradScaler
    install_grad_scaler replaces (with its settings) when ``scaler``."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2)
    # half weights: the masters are fp32
    model = GPT2LMHeadModel(config).to(torch.float16 if fp16 else torch.bfloat16)
    if inf_at is not None:
        inject_inf(model, inf_at)
    record = Record()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=16,
                                 learning_rate=3e-3, lr_scheduler_type="linear", max_grad_norm=0.0,
                                 logging_steps=1, save_strategy="no", report_to=[],
                                 use_cpu=not torch.cuda.is_available(), fp16=fp16, seed=0)
        if use_cls_and_kwargs:  # the Trainer builds the optimizer (and its default scheduler)
            kw = dict(optimizer_cls_and_kwargs=(fused_amp.optim.AdamW, dict(lr=3e-3, max_grad_norm=1.0)))
        else:
            optimizer = fused_amp.optim.AdamW(model.parameters(), lr=3e-3, max_grad_norm=1.0)
            schedule = transformers.get_linear_schedule_with_warmup(optimizer, 0, steps)
            kw = dict(optimizers=(optimizer, schedule))
        trainer = Trainer(model=model, args=args, train_dataset=TokenData(), callbacks=[record], **kw)
        if scaler and fp16:
            fused_amp.integrations.install_grad_scaler(trainer.accelerator)  # accelerate's settings
        elif scaler:
            ours = fused_amp.GradScaler(trainer.accelerator.device.type, init_scale=2.0 ** 10,
                                        skip_on_host=skip_on_host)
            if skip_on_host:
                fused_amp.integrations.install_grad_scaler(trainer.accelerator, ours)
            else:  # (for the test of the trap install_grad_scaler avoids)
                trainer.accelerator.scaler = ours
        trainer.train()
    opt = trainer.optimizer
    while not isinstance(opt, fused_amp.optim.AdamW):  # accelerate's wrapper
        opt = opt.optimizer
    return dict(losses=record.losses, lrs=record.lrs, optimizer=opt, model=model,
                scheduler_steps=trainer.lr_scheduler.last_epoch,
                optimizer_steps=int(next(iter(opt.state.values()))["step"].item()),
                scale=trainer.accelerator.scaler.get_scale() if scaler else None)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--scaler", action="store_true", help="fused_amp.GradScaler in accelerate")
    parser.add_argument("--inf-at", type=int, default=None, help="make this step's grads overflow")
    a = parser.parse_args()
    r = main(a.steps, a.scaler, a.inf_at)
    print(f"loss {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}; optimizer steps {r['optimizer_steps']}, "
          f"scheduler steps {r['scheduler_steps']}, last grad norm {r['optimizer'].last_grad_norm.item():.3f}")
