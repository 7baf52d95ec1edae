"""Memory and time of step_in_backward against the normal loop: a transformer-like model of about
50M bf16 params trains a few steps in a fresh process per setting; each reports its peak
resident memory (and on CUDA its peak allocated memory) above what the process held before the
model was built, per param, beside the bytes per param the roofline predicts (params, grads
unless released, masters and state), and the time of a training step.

Run: python -m benchmarks.in_backward [--device cpu|cuda] [--steps N] [--width D] [--blocks B]"""
import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

# the memory modes (AdamW) and their bytes per param with grads (README's table)
MODES = {"exact masters, fp32 state": (dict(master_weights=True), 16),
         "exact masters (remainder), 8-bit state": (dict(master_weights="remainder", state_dtype=torch.uint8), 8),
         "24-bit masters, 8-bit state": (dict(master_weights="remainder8", state_dtype=torch.uint8), 7)}
BUCKETS = [None, 0, 1 << 20, 16 << 20]  # None: the normal loop; else step_in_backward's bucket_bytes


class Block(torch.nn.Module):
    def __init__(self, d, **where):  # built in bf16 on its device: no fp32 copy ever held
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d, **where), torch.nn.LayerNorm(d, **where)
        self.qkv, self.out = torch.nn.Linear(d, 3 * d, **where), torch.nn.Linear(d, d, **where)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d, **where), torch.nn.Linear(4 * d, d, **where)

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        x = x + self.out(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # (KiB on Linux)


def timed_steps(device, params, loss, options, bucket, steps):
    """(optimizer, seconds per step): AdamW with ``options`` over ``params``, stepping in
    backward with ``bucket`` (None: the normal loop), ``steps`` times loss().backward(), step,
    zero_grad."""
    import fused_amp

    opt = fused_amp.optim.AdamW(params, lr=1e-4, **options)
    if bucket is not None:
        fused_amp.optim.step_in_backward(opt, bucket)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss().backward()
        opt.step()
        opt.zero_grad()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return opt, times


def one_setting(device, mode, bucket, steps, width, blocks):
    """Runs in its own process: peak memory above the start, per param, and step times."""
    torch.manual_seed(0)
    base_rss = rss_bytes()
    x = torch.randn(2, 64, width, device=device, dtype=torch.bfloat16)
    model = torch.nn.Sequential(*[Block(width, device=device, dtype=torch.bfloat16) for _ in range(blocks)])
    n = sum(p.numel() for p in model.parameters())
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    _, times = timed_steps(device, model.parameters(), lambda: model(x).float().pow(2).mean(), MODES[mode][0],
                           bucket, steps)
    out = dict(params=n, rss_per_param=(rss_bytes() - base_rss) / n, step_ms=1e3 * statistics.median(times[1:]))
    if device == "cuda":
        out["allocated_per_param"] = torch.cuda.max_memory_allocated() / n
    return out


def host_time(device, bucket, tensors=512, numel=256, steps=20):
    """Milliseconds of backward + step over many small params, where the op calls' fixed cost
    (one per bucket in backward, one per group in the normal step) shows."""
    params = [torch.nn.Parameter(torch.randn(numel, device=device, dtype=torch.bfloat16)) for _ in range(tensors)]
    _, times = timed_steps(device, params, lambda: sum((p.float() * p.float()).sum() for p in params), {}, bucket,
                           steps)
    return 1e3 * statistics.median(times[2:])


def in_child(args, setting, *extra):
    """What ``setting`` prints when run in a fresh process (--one)."""
    cmd = [sys.executable, "-m", "benchmarks.in_backward", "--device", args.device, *extra, "--one", json.dumps(setting)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])


def loop_name(bucket):
    return "normal" if bucket is None else f"in backward, bucket {bucket >> 10} KiB"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # (a child process: its setting as JSON)
    args = parser.parse_args(argv)
    if args.one:
        mode, bucket = json.loads(args.one)
        if mode == "host":
            print(json.dumps(host_time(args.device, bucket)))
            return
        print(json.dumps(one_setting(args.device, mode, bucket, args.steps, args.width, args.blocks)))
        return
    print(f"AdamW on a {args.blocks}-block transformer-like model, width {args.width}, bf16, {args.device}, "
          f"{args.steps} steps per fresh process; memory above the process's start, per param")
    print("| mode | loop | bytes/param predicted | peak RSS bytes/param | step ms |")
    print("|---|---|---|---|---|")
    for mode, (_, with_grads) in MODES.items():
        for bucket in BUCKETS:
            r = in_child(args, [mode, bucket], "--steps", str(args.steps), "--width", str(args.width),
                         "--blocks", str(args.blocks))
            predicted = with_grads if bucket is None else with_grads - 2
            extra = f" ({r['allocated_per_param']:.2f} allocated)" if "allocated_per_param" in r else ""
            print(f"| {mode} | {loop_name(bucket)} | {predicted} | {r['rss_per_param']:.2f}{extra} | "
                  f"{r['step_ms']:.0f} |", flush=True)
    print("\nHost time: backward + step over 512 bf16 params of 256 elements (median of 18 steps), each "
          "loop in its own process")
    print("| loop | ms | per param vs normal |")
    print("|---|---|---|")
    normal = None
    for bucket in BUCKETS:
        ms = in_child(args, ["host", bucket])
        normal = ms if bucket is None else normal
        print(f"| {loop_name(bucket)} | {ms:.2f} | {1e3 * (ms - normal) / 512:+.1f} us |", flush=True)


if __name__ == "__main__":
    main()
