"""End-to-end training steps (autocast forward, scaled backward, optimizer step) of a small
transformer and an MLP, for the three implementations on the same batches."""
import torch

import fused_amp
from fused_amp.benchmark import harness, impls, workloads
from fused_amp.benchmark.impls import INIT_SCALE, torch_best_optimizer


def cases(ctx):
    """Every model in each autocast dtype the device multiplies natively; a dtype the CPU
    emulates is skipped (and reported so): its matmuls would time the missing units."""
    out = []
    for dtype in (["bfloat16"] if ctx.device == "cpu" else ["float16", "bfloat16"]):
        slowdown, is_native = ctx.native[dtype]
        for model in ("transformer", "mlp"):
            if is_native:
                out.append((f"{model}/{dtype}", lambda c, m=model, d=dtype: run(c, m, d)))
            else:
                ctx.skip("train", f"{model}/{dtype}", f"{dtype} matmuls are emulated on this CPU "
                         f"({slowdown:.1f}x the fp32 time): the case would time the CPU, not fused_amp")
    return out


def make_model(name, device):
    torch.manual_seed(0)
    model = workloads.TinyTransformer() if name == "transformer" else workloads.MLP()
    return model.to(device)


def batches(name, n, device, batch, seq):
    gen = torch.Generator().manual_seed(1)
    for _ in range(n):
        if name == "transformer":
            tokens = torch.randint(0, 4096, (batch, seq + 1), generator=gen).to(device)
            yield tokens[:, :-1], tokens[:, 1:]
        else:
            x = torch.randn(batch, 256, generator=gen).to(device)
            yield x, x[:, :16].sin()


def loss_of(name, model, x, y, dtype, device):
    with torch.autocast(device_type=device, dtype=dtype):
        out = model(x)
    if name == "transformer":
        return torch.nn.functional.cross_entropy(out.float().flatten(0, 1), y.flatten())
    return torch.nn.functional.mse_loss(out.float(), y)


class Trainer:
    """One implementation's model, optimizer and scaler; ``step(x, y)`` trains on one batch."""

    def __init__(self, impl, name, dtype, device):
        self.impl, self.name, self.dtype, self.device = impl, name, dtype, device
        model = make_model(name, device)
        kw = dict(lr=3e-4, weight_decay=1e-2)
        if impl == "torch_amp":
            self.model = model
            self.opt = torch_best_optimizer(torch.optim.AdamW, model.parameters(), kw)
            self.scaler = torch.amp.GradScaler(device, init_scale=INIT_SCALE)
        else:
            self.model = model.to(dtype)
            if impl == "fused_amp":
                self.opt = fused_amp.optim.AdamW(self.model.parameters(), **kw, **impls.FUSED_AMP_SETTINGS)
                self.scaler = fused_amp.GradScaler(device, init_scale=INIT_SCALE)
            else:
                self.masters = [torch.nn.Parameter(p.detach().float()) for p in self.model.parameters()]
                self.opt = torch_best_optimizer(torch.optim.AdamW, self.masters, kw)
                self.scale = torch.full((), INIT_SCALE, device=device)
                self.tracker = torch.zeros((), dtype=torch.int32, device=device)
        self.loss = None

    def step(self, x, y):
        self.opt.zero_grad(set_to_none=True)
        if self.impl == "torch_master":  # its optimizer holds the masters, not the model's params
            for p in self.model.parameters():
                p.grad = None
        loss = loss_of(self.name, self.model, x, y, self.dtype, self.device)
        if self.impl != "torch_master":
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            (loss * self.scale).backward()
            params = [p for p in self.model.parameters() if p.grad is not None]
            grads = [p.grad for p in params]
            found = torch.zeros((), device=self.device)
            torch._amp_foreach_non_finite_check_and_unscale_(
                grads, found, self.scale.double().reciprocal().float())
            if found.item() == 0:
                for m, g in zip(self.masters, (p.grad for p in self.model.parameters())):
                    m.grad = g.float() if g is not None else None
                self.opt.step()
                with torch.no_grad():
                    torch._foreach_copy_(list(self.model.parameters()), self.masters)
            torch._amp_update_scale_(self.scale, self.tracker, found, 2.0, 0.5, 2000)
        self.loss = loss.detach()

    def held_tensors(self):
        """weights, grads, masters and optimizer state"""
        extra = getattr(self, "masters", [])
        params = list(self.model.parameters())
        return (params + [p.grad for p in params if p.grad is not None] + extra
                + [t for s in self.opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)])


def run(ctx, name, dtype_name):
    dtype = getattr(torch, dtype_name)
    batch, seq = (8, 64) if ctx.device == "cpu" else (32, 128)
    if name == "mlp":
        batch = 64 if ctx.device == "cpu" else 1024
    trainers = {impl: Trainer(impl, name, dtype, ctx.device) for impl in ("fused_amp", "torch_amp", "torch_master")}
    warmup = 2
    n_steps = warmup + ctx.reps
    times = {impl: [] for impl in trainers}
    peaks = {impl: 0 for impl in trainers}
    for i, (x, y) in enumerate(batches(name, n_steps, ctx.device, batch, seq)):
        for impl, trainer in trainers.items():  # the same batch for each, in turns
            if ctx.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t = harness.time_once(lambda: trainer.step(x, y), ctx.device)
            if ctx.device == "cuda":
                peaks[impl] = max(peaks[impl], torch.cuda.max_memory_allocated())
            if i >= warmup:
                times[impl].append(t)
    tokens = batch * (seq if name == "transformer" else 1)
    n = sum(p.numel() for p in trainers["fused_amp"].model.parameters())
    extra = {}
    for impl, trainer in trainers.items():
        x, y = next(batches(name, 1, ctx.device, batch, seq))
        extra[impl] = {"loss": float(trainer.loss.item()),
                       "held_bytes": harness.tensor_bytes(trainer.held_tensors()),
                       "peak_mem_bytes": peaks[impl] if ctx.device == "cuda" else None,
                       "host_syncs_per_step": harness.count_host_syncs(lambda: trainer.step(x, y), ctx.device)}
    records = harness.make_records("train", f"{name}/{dtype_name}", ctx.device, dtype_name, n,
                                   len(list(trainers["fused_amp"].model.parameters())), times,
                                   ctx.ceiling_gbps, None, extra)
    for rec in records:
        rec["tokens_per_s"] = tokens / (rec["time_ms"] / 1e3)
        rec["steps"] = n_steps
    return records
