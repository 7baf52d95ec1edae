"""Which 8-bit code map for Adam's moments: measured, not assumed (issue 22).

Trains the char LM of fused_amp/benchmark/convergence.py with fp32 AdamW state, then (1) quantizes the
moments it reached with each candidate map and block size and reports the error of one step's
update m / (sqrt(v) + eps) against the fp32 state's, and the largest update any element gets
(the hazard: a v that dequantizes to 0 beside a nonzero m moves a weight by lr * m / eps); and
(2) trains again from the same start with the state kept quantized at every step (a pure-PyTorch
Adam, the masters fp32), over 3 seeds, and reports the final held-out loss.

Candidates, each a pair (map of m, map of v), blockwise absmax scaling:
  linear/linear        m and v linear in [-1, 1] and [0, 1] (the hazard's pairing)
  linear/linear-sqrt   m linear, sqrt(v) linear (v = absmax * (c/255)^2)
  sqrt/fourth-root     m companded (m = absmax * s (c/127)^2), sqrt(v) companded alike
                       (v = absmax * (c/255)^4): closed forms, no table
  sqrt/linear-sqrt     m companded, sqrt(v) linear (one square root less per element)
  dynamic/dynamic      bitsandbytes' dynamic tree map (signed for m, unsigned for v), nearest code

    python benchmarks/quant_maps.py [--steps 600] [--seeds 3]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F

from fused_amp.benchmark import convergence


def dynamic_map(signed: bool) -> torch.Tensor:
    """The dynamic tree map as bitsandbytes describes it (Dettmers et al. 2022, 8-bit
    optimizers): 7 decades of exponent, each decade split linearly into 2^i + 1 fractions."""
    values = []
    exponent_bits = 7
    for i in range(exponent_bits):
        count = 2 ** (i + (0 if signed else 1)) + 1
        edges = torch.linspace(0.1, 1, count, dtype=torch.float64)
        means = (edges[:-1] + edges[1:]) / 2
        decade = 10.0 ** (-(exponent_bits - 1) + i)
        values += (decade * means).tolist()
        if signed:
            values += (-decade * means).tolist()
    values += [0.0, 1.0]
    out = torch.tensor(sorted(values), dtype=torch.float64)
    return out[:256].float() if out.numel() > 256 else out.float()


def _nearest(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    idx = torch.searchsorted(table, x.contiguous()).clamp(1, table.numel() - 1)
    lo, hi = table[idx - 1], table[idx]
    return torch.where((x - lo).abs() <= (hi - x).abs(), lo, hi)


def quantize(x: torch.Tensor, kind: str, block: int, second: bool) -> torch.Tensor:
    """x quantized and dequantized blockwise with the named map (second: v, else m)."""
    flat = x.reshape(-1)
    pad = (-flat.numel()) % block
    blocks = torch.cat([flat, flat.new_zeros(pad)]).view(-1, block)
    absmax = blocks.abs().amax(1, keepdim=True)
    scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    q = blocks / scale  # in [-1, 1] (m) or [0, 1] (v)
    if kind == "linear":
        levels = 255.0 if second else 127.0
        out = torch.round(q * levels) / levels
    elif kind == "linear-sqrt":  # second moment only
        c = torch.round(q.sqrt() * 255)
        c = torch.where(q > 0, c.clamp_min(1), c)
        out = (c / 255) ** 2
    elif kind == "companded":
        if second:
            c = torch.round(q.sqrt().sqrt() * 255)
            c = torch.where(q > 0, c.clamp_min(1), c)
            out = (c / 255) ** 4
        else:
            c = torch.round(q.abs().sqrt() * 127)
            out = torch.sign(q) * (c / 127) ** 2
    elif kind == "dynamic":
        out = _nearest(dynamic_map(signed=not second), q)
    else:
        raise ValueError(kind)
    return (out * absmax).reshape(-1)[:flat.numel()].view_as(x)


PAIRS = {"linear/linear": ("linear", "linear"), "linear/linear-sqrt": ("linear", "linear-sqrt"),
         "sqrt/fourth-root": ("companded", "companded"), "sqrt/linear-sqrt": ("companded", "linear-sqrt"),
         "dynamic/dynamic": ("dynamic", "dynamic")}


def adam_train(seed: int, steps: int, pair=None, block: int = 256, lr: float = 2e-3,
               snapshot: bool = False, min_size: int = 4096):
    """AdamW (no weight decay) on fp32 masters of the bf16 char LM, state quantized with
    ``pair`` after every step (None: fp32 state). Returns (held-out loss, moments at the end)."""
    data = convergence.corpus()
    split = data.numel() * 9 // 10
    train_data, held_out = data[:split], data[split:]
    torch.manual_seed(seed)
    model = convergence.CharMLP().bfloat16()
    params = list(model.parameters())
    masters = [p.detach().float() for p in params]
    m = [torch.zeros_like(x) for x in masters]
    v = [torch.zeros_like(x) for x in masters]
    gen = torch.Generator().manual_seed(seed)
    b1, b2, eps = 0.9, 0.999, 1e-8
    for t in range(1, steps + 1):
        x, y = convergence._batch(train_data, gen, 64)
        for p in params:
            p.grad = None
        F.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for i, p in enumerate(params):
                g = p.grad.float()
                m[i].lerp_(g, 1 - b1)
                v[i].mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = v[i].sqrt() / (1 - b2 ** t) ** 0.5 + eps
                masters[i].addcdiv_(m[i], denom, value=-lr / (1 - b1 ** t))
                if pair is not None and p.numel() >= min_size:
                    m[i] = quantize(m[i], pair[0], block, False)
                    v[i] = quantize(v[i], pair[1], block, True)
                p.copy_(masters[i])
    eval_gen = torch.Generator().manual_seed(12345)
    with torch.no_grad():
        losses = [F.cross_entropy(model(x), y).item()
                  for x, y in (convergence._batch(held_out, eval_gen, 512) for _ in range(8))]
    return statistics.fmean(losses), (m, v, steps)


def one_step_errors(moments, eps=1e-8):
    m, v, t = moments
    b2 = 0.999
    rows = []
    for name, (km, kv) in PAIRS.items():
        for block in (256, 2048):
            num = den = 0.0
            worst = 0.0
            ref_worst = 0.0
            for mi, vi in zip(m, v):
                if mi.numel() < 4096:
                    continue
                u = mi / (vi.sqrt() / (1 - b2 ** t) ** 0.5 + eps)
                mq, vq = quantize(mi, km, block, False), quantize(vi, kv, block, True)
                uq = mq / (vq.sqrt() / (1 - b2 ** t) ** 0.5 + eps)
                num += (uq - u).pow(2).sum().item()
                den += u.pow(2).sum().item()
                worst = max(worst, uq.abs().max().item())
                ref_worst = max(ref_worst, u.abs().max().item())
            rows.append((name, block, (num / den) ** 0.5, worst / ref_worst))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    loss, moments = adam_train(0, args.steps)
    print(f"one step from the moments of fp32-state AdamW after {args.steps} steps (seed 0):")
    print("| map (m / v) | block | relative error of the update | largest update vs fp32 state's |")
    print("|---|---|---|---|")
    for name, block, err, worst in one_step_errors(moments):
        print(f"| {name} | {block} | {err:.4f} | {worst:.3g}x |")
    print(f"\ntraining with the state quantized at every step ({args.steps} steps, seeds 0..{args.seeds - 1}, block 256):")
    print("| state | held-out loss, mean | seeds' range |")
    print("|---|---|---|")
    for name, pair in [("fp32", None)] + [(k, v) for k, v in PAIRS.items() if k != "linear/linear"]:
        losses = [adam_train(s, args.steps, None if pair is None else pair)[0] for s in range(args.seeds)]
        print(f"| {name} | {statistics.fmean(losses):.4f} | {min(losses):.4f}-{max(losses):.4f} |", flush=True)


if __name__ == "__main__":
    main()
