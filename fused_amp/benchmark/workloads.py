"""Parameter lists of real architectures (from their layer shapes) and small models to train."""
from typing import List

import torch


def gpt2_small_shapes() -> List[tuple]:
    """GPT-2 small (124M): token and position embeddings, 12 blocks of width 768."""
    d, vocab, ctx = 768, 50257, 1024
    shapes = [(vocab, d), (ctx, d)]
    for _ in range(12):
        shapes += [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,),
                   (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
    return shapes + [(d,), (d,)]


def resnet50_shapes() -> List[tuple]:
    """ResNet-50 (25.6M): conv weights, batch-norm scales and shifts, the classifier."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    in_ch = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            out = width * 4
            shapes += [(width, in_ch, 1, 1), (width,), (width,), (width, width, 3, 3), (width,),
                       (width,), (out, width, 1, 1), (out,), (out,)]
            if b == 0:
                shapes += [(out, in_ch, 1, 1), (out,), (out,)]
            in_ch = out
    return shapes + [(1000, 2048), (1000,)]


def llm_1b_shapes() -> List[tuple]:
    """A 1.2B-parameter decoder: 24 blocks of width 2048 (GPUs with the memory only)."""
    d, vocab = 2048, 50304
    shapes = [(vocab, d)]
    for _ in range(24):
        shapes += [(d,), (3 * d, d), (d, d), (d,), (4 * d, d), (d, 4 * d)]
    return shapes + [(d,)]


def many_small_shapes(n_tensors: int = 10_000, size: int = 1_000) -> List[tuple]:
    return [(size,)] * n_tensors


def model_like_shapes(n_params: int) -> List[tuple]:
    """GPT-2-block-shaped tensors (width 768) adding up to exactly n_params (the last one
    holds the remainder)."""
    d = 768
    block = [(3 * d, d), (3 * d,), (d, d), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,), (d,), (d,)]
    shapes, total = [], 0
    while total < n_params:
        for s in block:
            size = torch.Size(s).numel()
            if total + size > n_params:
                shapes.append((n_params - total,))
                return shapes
            shapes.append(s)
            total += size
    return shapes


def llama_like_tensor_count(n_params: float) -> int:
    """The param tensors of a Llama-shaped model of about ``n_params`` params: per layer 9 (q, k,
    v, o, gate, up, down, two norms), about 12 d^2 params, with d / 128 layers (Llama-2 7B and
    13B: 32 layers at 4096, 40 at 5120); plus the embedding, the head and the final norm.
    Llama-2 7B (6.7B params): 291."""
    d = (n_params * 128 / 12) ** (1 / 3)
    return 9 * max(1, round(d / 128)) + 3


def n_params(shapes) -> int:
    return sum(torch.Size(s).numel() for s in shapes)


def scaled(shapes, factor: float):
    """The list shrunk by ``factor`` (for testing the suite itself): fewer, same-shaped tensors."""
    if factor >= 1.0:
        return shapes
    keep = max(1, int(len(shapes) * factor))
    return [tuple(max(1, int(x * factor ** 0.5)) if i == 0 else x for i, x in enumerate(s))
            for s in shapes[:keep]]


class MLP(torch.nn.Module):
    def __init__(self, width=1024, depth=4, d_in=256, d_out=16):
        super().__init__()
        layers, d = [], d_in
        for _ in range(depth):
            layers += [torch.nn.Linear(d, width), torch.nn.GELU()]
            d = width
        self.net = torch.nn.Sequential(*layers, torch.nn.Linear(d, d_out))

    def forward(self, x):
        return self.net(x)


class TinyTransformer(torch.nn.Module):
    """A GPT-style language model: 6 layers of width 512, 8 heads."""

    def __init__(self, vocab=4096, width=512, layers=6, heads=8, ctx=128):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Parameter(torch.zeros(ctx, width))
        layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                                 batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.head(self.blocks(x, mask=mask, is_causal=True))
