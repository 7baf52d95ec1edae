"""Convergence of the memory modes on real text: a character-level language model trained on
the English text of Python's own documentation (``pydoc_data.topics``, shipped with every
CPython), with bf16 weights, under each way of keeping the optimizer's state, over several seeds.

The forward pass computes in fp32 from the bf16 weights (as a GPU's bf16 matmuls accumulate in
fp32), so a CPU without bf16 units times and rounds the same way; the gradients reach the bf16
params as bf16. Used by the benchmark suite (suites/memory.py) and the tests
(tests/test_memory_modes.py)."""
import statistics
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

import fused_amp
from fused_amp.benchmark import recipes

VOCAB = 128  # ASCII; the few other characters of the text map to 0
CONTEXT = 16


def corpus() -> torch.Tensor:
    """The documentation text as ASCII codes: about 465,000 characters, fixed per Python version."""
    from pydoc_data.topics import topics
    text = "".join(topics[k] for k in sorted(topics))
    return torch.tensor([c if c < VOCAB else 0 for c in text.encode("ascii", "replace")], dtype=torch.long)


class CharMLP(torch.nn.Module):
    """Embeddings of the last CONTEXT characters, one hidden layer, logits of the next one."""

    def __init__(self, width: int = 256, embed: int = 32):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, embed)
        self.hidden = torch.nn.Linear(CONTEXT * embed, width)
        self.out = torch.nn.Linear(width, VOCAB)

    def forward(self, x):
        h = F.embedding(x, self.embed.weight.float()).flatten(1)
        h = F.gelu(F.linear(h, self.hidden.weight.float(), self.hidden.bias.float()))
        return F.linear(h, self.out.weight.float(), self.out.bias.float())


def _batch(data: torch.Tensor, gen: torch.Generator, size: int):
    starts = torch.randint(0, data.numel() - CONTEXT - 1, (size,), generator=gen)
    idx = starts[:, None] + torch.arange(CONTEXT + 1)
    chunk = data[idx]
    return chunk[:, :-1], chunk[:, -1]


# How each mode builds its optimizer over a bf16 model: fused_amp's memory modes, plain bf16
# (no masters), and outside references where installed (optional: torch-optimi, torchao).
def _fused(**kw):
    return lambda params, lr: fused_amp.optim.AdamW(params, lr=lr, weight_decay=0.0, **kw)


def _optimi_kahan(params, lr):
    from optimi import AdamW
    return AdamW(params, lr=lr, weight_decay=0.0, kahan_sum=True)


def _bnb_8bit(params, lr):
    from bitsandbytes.optim import AdamW8bit
    return AdamW8bit(params, lr=lr, weight_decay=0.0)


def _torchao_8bit(params, lr):
    from torchao.optim import AdamW8bit
    return AdamW8bit(params, lr=lr, weight_decay=0.0)


def _torchao_4bit(params, lr):
    from torchao.optim import AdamW4bit
    return AdamW4bit(params, lr=lr, weight_decay=0.0)


def _torchao_sr(params, lr):
    from torchao.optim import _AdamW
    return _AdamW(params, lr=lr, weight_decay=0.0, bf16_stochastic_round=True)


MODES: Dict[str, Callable] = {
    "fp32 masters": _fused(),
    "remainder": _fused(master_weights="remainder"),
    "bf16 state": _fused(state_dtype=torch.bfloat16),
    "bf16 state, stochastic": _fused(state_dtype=torch.bfloat16, stochastic_rounding=True),
    "remainder + bf16 state, stochastic": _fused(master_weights="remainder", state_dtype=torch.bfloat16,
                                                 stochastic_rounding=True),
    "8-bit state": _fused(state_dtype=torch.uint8),
    "8-bit state, stochastic": _fused(state_dtype=torch.uint8, stochastic_rounding=True),
    "remainder + 8-bit state": _fused(master_weights="remainder", state_dtype=torch.uint8),
    "24-bit masters": _fused(master_weights="remainder8"),
    "24-bit masters + 8-bit state": _fused(master_weights="remainder8", state_dtype=torch.uint8),
    "4-bit state": _fused(state_dtype=torch.uint4),
    "remainder + 4-bit state": _fused(master_weights="remainder", state_dtype=torch.uint4),
    "24-bit masters + 4-bit state": _fused(master_weights="remainder8", state_dtype=torch.uint4),
    "plain bf16 (no masters)": _fused(master_weights=False),
    "torch-optimi Kahan AdamW": _optimi_kahan,
    "torchao bf16 SR AdamW": _torchao_sr,
    "bitsandbytes AdamW8bit (bf16 weights)": _bnb_8bit,
    "torchao AdamW8bit (bf16 weights)": _torchao_8bit,
    "torchao AdamW4bit (bf16 weights)": _torchao_4bit,
}
OPTIONAL = {"torch-optimi Kahan AdamW": "optimi", "torchao bf16 SR AdamW": "torchao",
            "bitsandbytes AdamW8bit (bf16 weights)": "bitsandbytes",
            "torchao AdamW8bit (bf16 weights)": "torchao", "torchao AdamW4bit (bf16 weights)": "torchao"}


def available(mode: str, optional: Dict[str, str] = OPTIONAL) -> bool:
    """False for an outside reference (``optional``: mode -> package) whose package is not installed."""
    return mode not in optional or recipes.installed(optional[mode])


def train(mode: str, seed: int, steps: int, lr: float = 2e-3, batch: int = 64,
          data: torch.Tensor = None, make: Callable = None, dtype: torch.dtype = torch.bfloat16) -> Dict:
    """Train the model from seed ``seed`` for ``steps`` steps; returns the final held-out loss
    (mean over fixed batches drawn from the last tenth of the text) and the seconds per step.
    The seed decides the initial weights, fp32 and identical in every mode, then rounded to bf16
    (``dtype``), and the batches. The optimizer is the mode's, or ``make(params, lr)``."""
    data = corpus() if data is None else data
    split = data.numel() * 9 // 10
    train_data, held_out = data[:split], data[split:]
    torch.manual_seed(seed)
    model = CharMLP().to(dtype)
    opt = (make or MODES[mode])(model.parameters(), lr)
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for _ in range(steps):
        x, y = _batch(train_data, gen, batch)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    per_step = (time.perf_counter() - start) / steps
    eval_gen = torch.Generator().manual_seed(12345)
    with torch.no_grad():
        losses = [F.cross_entropy(model(x), y).item()
                  for x, y in (_batch(held_out, eval_gen, 512) for _ in range(8))]
    return dict(loss=statistics.fmean(losses), seconds_per_step=per_step)


def compare(modes: List[str], seeds: List[int], steps: int, **kw) -> Dict[str, Dict]:
    """Final losses of each mode over the seeds (the same seeds, so the same starts and batches
    in every mode), with their mean and spread (max - min)."""
    data = corpus()
    out = {}
    for mode in modes:
        runs = [train(mode, seed, steps, data=data, **kw) for seed in seeds]
        losses = [r["loss"] for r in runs]
        out[mode] = dict(losses=losses, mean=statistics.fmean(losses), spread=max(losses) - min(losses),
                         seconds_per_step=statistics.median(r["seconds_per_step"] for r in runs))
    return out
