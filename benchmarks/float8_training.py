"""fp8 training (torchao's float8 linears, tensorwise dynamic scaling) with fused_amp's optimizers
against torchao's recipe with torch's AdamW, on the character language model of the memory
suite (fused_amp.benchmark.convergence), 3 seeds each: the same seeds give the same starts and
batches everywhere.

- "torchao + torch AdamW (fp32 weights)": torchao's recipe as its docs give it, the model's
  weights fp32 and torch's AdamW stepping them;
- "torchao + fused_amp AdamW, bf16 weights + fp32 masters" and "... + remainder": the model in
  bf16, the optimizer keeping exact fp32 masters (4 bytes, or a 2-byte remainder);
- "torchao + torch AdamW (bf16 weights)": no masters, every update rounded to bf16.
Each float8 linear casts its weight and input to e4m3 in every forward (torch._scaled_mm runs on
the CPU). Run: python -m benchmarks.float8_training [steps] [--every-optimizer] (each optimizer
with torch's counterpart instead) [--without-counterpart] (Lion and AdEMAMix, which torch lacks:
ours on the float8 model against ours on the same model with bf16 linears) [--muon] (Muon on the
hidden matrix and AdamW on the rest, torch's pair against ours)."""
import statistics
import sys

import torch
import torch.nn.functional as F

import fused_amp
from fused_amp.benchmark import convergence


class Float8CharMLP(convergence.CharMLP):
    """The memory suite's model with its linears called as modules, so that torchao's
    convert_to_float8_training swaps them for float8 ones; computes in the weights' dtype."""

    def forward(self, x):
        h = self.embed(x).flatten(1)
        return self.out(F.gelu(self.hidden(h))).float()


def train(make, dtype, seed, steps, data, lr=2e-3, batch=64, float8=True):
    from torchao.float8 import convert_to_float8_training

    split = data.numel() * 9 // 10
    train_data, held_out = data[:split], data[split:]
    torch.manual_seed(seed)
    model = Float8CharMLP().to(dtype)
    if float8:
        convert_to_float8_training(model)  # tensorwise dynamic scaling (torchao's default)
    opt = make(model.parameters(), lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = convergence._batch(train_data, gen, batch)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    eval_gen = torch.Generator().manual_seed(12345)
    with torch.no_grad():
        return statistics.fmean(F.cross_entropy(model(x), y).item()
                                for x, y in (convergence._batch(held_out, eval_gen, 512) for _ in range(8)))


RECIPES = {
    "torchao + torch AdamW (fp32 weights)": (lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.0),
                                             torch.float32),
    "torchao + fused_amp AdamW, bf16 weights + fp32 masters":
        (lambda p, lr: fused_amp.optim.AdamW(p, lr=lr, weight_decay=0.0), torch.bfloat16),
    "torchao + fused_amp AdamW, bf16 weights + remainder":
        (lambda p, lr: fused_amp.optim.AdamW(p, lr=lr, weight_decay=0.0, master_weights="remainder"),
         torch.bfloat16),
    "torchao + torch AdamW (bf16 weights)": (lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.0),
                                             torch.bfloat16),
}


def every_optimizer():
    """Each optimizer of fused_amp.optim with torch's counterpart (torch has no Lion or
    AdEMAMix) at a learning rate the char LM trains with: torch's on the fp32 model (torchao's
    recipe), ours on the bf16 model with fp32 masters."""
    lrs = {"Adam": 2e-3, "AdamW": 2e-3, "SGD": 0.5, "Adagrad": 2e-2, "RMSprop": 1e-3, "Adamax": 2e-3,
           "RAdam": 2e-3, "NAdam": 2e-3, "Adadelta": 1.0, "Rprop": 1e-3}
    recipes = {}
    for name, lr in lrs.items():
        theirs, ours = getattr(torch.optim, name), getattr(fused_amp.optim, name)
        recipes[f"torchao + torch {name} (fp32 weights), lr {lr}"] = (lambda p, _, c=theirs, lr=lr: c(p, lr=lr),
                                                                      torch.float32)
        recipes[f"torchao + fused_amp {name}, bf16 + fp32 masters"] = (lambda p, _, c=ours, lr=lr: c(p, lr=lr),
                                                                       torch.bfloat16)
    return recipes


def without_counterpart():
    """Lion and AdEMAMix, which torch lacks: ours (bf16 + fp32 masters) on the float8 model
    against ours on the same model with its bf16 linears, at a learning rate the char LM trains
    with (Lion's update is a sign, so its lr is about a tenth of Adam's)."""
    recipes = {}
    for name, lr in {"Lion": 2e-4, "AdEMAMix": 2e-3}.items():
        ours = getattr(fused_amp.optim, name)
        for float8 in (True, False):
            linears = "float8 linears" if float8 else "bf16 linears (no fp8)"
            recipes[f"fused_amp {name}, lr {lr}, {linears}"] = (lambda p, _, c=ours, lr=lr: c(p, lr=lr),
                                                                torch.bfloat16, float8)
    return recipes


class Pair:
    """Two optimizers stepped as one: Muon for the hidden matrix, AdamW for the rest."""

    def __init__(self, first, second):
        self.optimizers = (first, second)

    def zero_grad(self, set_to_none=True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self):
        for o in self.optimizers:
            o.step()


def muon():
    """Muon on the hidden layer's weight (the one hidden matrix: Muon's recipe leaves embeddings
    and heads to AdamW) and AdamW on the rest: torch's pair on the fp32 model (torchao's recipe)
    against ours on the bf16 model with fp32 masters, both on the float8 model."""
    def pair(muon_cls, adamw_cls):
        def make(params, lr):
            params = list(params)  # (embed.weight, hidden.weight, hidden.bias, out.weight, out.bias)
            return Pair(muon_cls([params[1]], lr=2e-2), adamw_cls(params[:1] + params[2:], lr=lr, weight_decay=0.0))
        return make
    return {"torchao + torch Muon (lr 2e-2) + AdamW, fp32 weights": (pair(torch.optim.Muon, torch.optim.AdamW),
                                                                    torch.float32),
            "torchao + fused_amp Muon + AdamW, bf16 + fp32 masters": (pair(fused_amp.optim.Muon,
                                                                           fused_amp.optim.AdamW), torch.bfloat16)}


def main(steps=300, seeds=(0, 1, 2), recipes=RECIPES):
    data = convergence.corpus()
    print(f"char LM, float8 linears (torchao tensorwise), {steps} steps, seeds {list(seeds)}: held-out loss")
    for name, (make, dtype, *float8) in recipes.items():
        losses = [train(make, dtype, seed, steps, data, float8=float8[0] if float8 else True) for seed in seeds]
        print(f"  {name:56s} mean {statistics.fmean(losses):.4f}  spread {max(losses) - min(losses):.4f}  "
              f"({', '.join(f'{x:.4f}' for x in losses)})", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300,
         recipes=(every_optimizer() if "--every-optimizer" in sys.argv
                  else without_counterpart() if "--without-counterpart" in sys.argv
                  else muon() if "--muon" in sys.argv else RECIPES))
