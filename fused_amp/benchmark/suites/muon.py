"""One Muon step (scaler step + update, grads given) on a stack of transformer-like matrices:
L layers of (d, 4d), (4d, d) and four (d, d).

* fused_amp:  bf16 params with fp32 masters, fused_amp.GradScaler, fused_amp.optim.Muon.
* torch_amp:  fp32 params, torch.amp.GradScaler, torch.optim.Muon (its one implementation: a
              Python loop per matrix, no foreach or fused path).
* torch_bf16: bf16 params without masters (torch's Muon applies its updates in bf16).

Muon's step is mostly Newton-Schulz, compute and not bytes: no roofline fraction. Each record
also says which share of its step is spent outside Newton-Schulz: the time of the same step
with the implementation's Newton-Schulz replaced by the identity (timed in the same turns, on
the same grads), over the step's."""
import contextlib
import statistics

import torch

import fused_amp
import fused_amp.optim.muon as fused_amp_muon
from fused_amp.benchmark import harness, impls

KW = dict(lr=0.02, weight_decay=0.1)


def cases(ctx):
    # torch's bf16 products run at about 2 GFLOP/s on a CPU without bf16 instructions: d = 128
    # keeps its step at seconds (the quick run: 64, a fraction of one); a GPU takes d = 512
    d = (64 if ctx.quick else 128) if ctx.device == "cpu" else 512
    layers = 2 if ctx.quick else 12
    return [(f"muon/bfloat16/{layers}x{d}", lambda c, n=layers, d=d: run(c, n, d))]


def shapes_of(layers, d):
    return [s for _ in range(layers) for s in [(d, 4 * d), (4 * d, d)] + [(d, d)] * 4]


def _params(shapes, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).div_(s[1] ** 0.5).to(device, dtype))
            for s in shapes]


def _grads(params, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=gen).mul_(1e-3).to(p.device, p.dtype) for p in params]


IMPLS = {  # name: (param dtype, optimizer, scaler)
    "fused_amp": (torch.bfloat16, fused_amp.optim.Muon, fused_amp.GradScaler),
    "torch_amp": (torch.float32, torch.optim.Muon, torch.amp.GradScaler),
    "torch_bf16": (torch.bfloat16, torch.optim.Muon, torch.amp.GradScaler),
}


def build(name, shapes, device):
    dtype, optimizer, scaler = IMPLS[name]
    params = _params(shapes, dtype, device)
    return impls.ScalerStep(params, optimizer(params, **KW), scaler, device)


def _refresh(step, grads):
    def prepare():
        scale = step.scaler.get_scale()
        for p, g in zip(step.params, grads):
            p.grad = g * scale
    return prepare


@contextlib.contextmanager
def identity_ns(name):
    """The step of `name` with its Newton-Schulz replaced by the identity (the input, in bf16)."""
    module, attr = ((fused_amp_muon, "orthogonalize") if name == "fused_amp"
                    else (torch.optim._muon, "_zeropower_via_newtonschulz"))
    original = getattr(module, attr)
    setattr(module, attr, lambda x, *args: x.bfloat16())
    try:
        yield
    finally:
        setattr(module, attr, original)


def _without_ns(name, step):
    def run():
        with identity_ns(name):
            step()
    return run


def run(ctx, layers, d):
    device = ctx.device
    shapes = shapes_of(layers, d)
    built = {name: build(name, shapes, device) for name in IMPLS}
    grads = {name: _grads(s.params) for name, s in built.items()}
    timed = [harness.Impl(name, s.step, _refresh(s, grads[name])) for name, s in built.items()]
    # the same steps without Newton-Schulz, on twins (their state must not drift from the timed ones')
    twins = {name: build(name, shapes, device) for name in IMPLS}
    timed += [harness.Impl(f"{name}/no-ns", _without_ns(name, s.step), _refresh(s, grads[name]))
              for name, s in twins.items()]
    times = harness.time_alternating(timed, device, max(3, ctx.reps // 3))
    outside = {name[:-6]: times.pop(name) for name in list(times) if name.endswith("/no-ns")}
    extra = {}
    for t in timed:
        if t.name.endswith("/no-ns"):
            continue
        t.prepare()
        extra[t.name] = {"host_syncs_per_step": harness.count_host_syncs(t.run, device),
                         "held_bytes": harness.tensor_bytes(built[t.name].tensors()),
                         "outside_ns_frac": statistics.median(outside[t.name]) / statistics.median(times[t.name])}
    n = sum(a * b for a, b in shapes)
    return harness.make_records("muon", f"muon/bfloat16/{layers}x{d}", device, "bfloat16", n, len(shapes),
                                times, ctx.ceiling_gbps, None, extra)
