"""10,000 steps of a small bf16 model under fused_amp's optimizer and GradScaler, as a long job
runs them: an overflow every 97 steps, clipping at every step, lr changed at every step, a
param group added and removed every 1,000 steps, and the optimizer and scaler saved and loaded
every 1,000 steps. Prints, as JSON, the resident memory (and on CUDA the memory torch's
allocator holds) and the sizes of what the optimizer and scaler keep between steps, every
1,000 steps. Run in a fresh process by tests/test_long_run.py
(``--leak`` keeps 1 KiB per step on purpose: the test checks that its bound catches it)."""
import argparse
import io
import json
import math
import os
import resource

import torch

import fused_amp

MODES = {
    "fp32-masters": dict(master_weights=True),
    "24-bit-masters+8-bit-state": dict(master_weights="remainder8", state_dtype=torch.uint8,
                                       min_8bit_size=256),
}


def rss_kib() -> int:
    """The resident set size now (Linux), in KiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def save_and_load(opt, scaler):
    buffer = io.BytesIO()
    torch.save({"optimizer": opt.state_dict(), "scaler": scaler.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer)
    opt.load_state_dict(checkpoint["optimizer"])
    scaler.load_state_dict(checkpoint["scaler"])


def run(mode: str, steps: int, every: int, leak: bool, device: str):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 32)).to(device, torch.bfloat16)
    extra = torch.nn.Linear(32, 32).to(device, torch.bfloat16)
    opt = fused_amp.optim.AdamW(model.parameters(), lr=1e-3, max_grad_norm=1.0, **MODES[mode])
    scaler = fused_amp.GradScaler(device, init_scale=2.0 ** 10, growth_interval=50, track_overflows=True)
    x = torch.randn(16, 32).to(device, torch.bfloat16)
    cuda = torch.device(device).type == "cuda"
    kept, samples = [], []
    for step in range(steps):
        if step % every == every // 2:  # a group comes and goes
            if len(opt.param_groups) == 1:
                opt.add_param_group({"params": list(extra.parameters())})
            else:  # removed with its state, or torch's state_dict() fails on the orphans
                for p in opt.param_groups.pop()["params"]:
                    opt.state.pop(p, None)
        for group in opt.param_groups:
            group["lr"] = 1e-3 / (1.0 + step * 1e-3)
        opt.zero_grad()
        out = model(x)
        if len(opt.param_groups) > 1:
            out = extra(out)
        loss = out.float().pow(2).mean()
        if step % 97 == 13:
            loss = loss * math.inf  # inf/NaN grads: the scaler skips the step and backs off
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if leak:
            kept.append(torch.empty(256, device=device))
        if step % every == every - 1:
            cached_lists = len(opt._lists.groups)  # (loading a state dict empties it)
            save_and_load(opt, scaler)
            samples.append(dict(
                step=step + 1, rss_kib=rss_kib(),
                max_rss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                cached_lists=cached_lists, groups=len(opt.param_groups),
                state_entries=len(opt.state),
                scaler_optimizer_states=len(scaler._per_optimizer_states),
                overflow_flags=len(scaler._last_overflow),
                skipped_steps=scaler.overflow_report().skipped_steps,
                cuda_allocated=torch.cuda.memory_allocated() if cuda else 0,
                cuda_reserved=torch.cuda.memory_reserved() if cuda else 0))
    return samples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=sorted(MODES), default="fp32-masters")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=1_000)
    parser.add_argument("--leak", action="store_true")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    print(json.dumps(run(args.mode, args.steps, args.every, args.leak, args.device)))


if __name__ == "__main__":
    main()
