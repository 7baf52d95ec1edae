"""fused_amp.ops.unscale_ against torch._amp_foreach_non_finite_check_and_unscale_."""
import torch

from fused_amp.benchmark import harness, workloads
from fused_amp.benchmark.roofline import bytes_per_param
from fused_amp import ops


def cases(ctx):
    lists = [("gpt2-small", workloads.gpt2_small_shapes()), ("resnet50", workloads.resnet50_shapes()),
             ("10k-x-1k", workloads.many_small_shapes())]
    if ctx.device == "cuda" and torch.cuda.get_device_properties(0).total_memory > 40e9 and not ctx.quick:
        lists.append(("llm-1b", workloads.llm_1b_shapes()))
    dtypes = ["float32", "bfloat16"] + (["float16"] if ctx.device == "cuda" else [])
    # on a CPU the ResNet-50 list in bf16 only: a full run (3 repeats) keeps to 5 minutes
    return [(f"{name}/{dtype}", lambda c, s=shapes, n=name, d=dtype: run(c, n, s, d))
            for name, shapes in lists for dtype in dtypes
            if not (ctx.device == "cpu" and name == "resnet50" and dtype == "float32")]


def run(ctx, name, shapes, dtype_name):
    dtype = getattr(torch, dtype_name)
    shapes = workloads.scaled(shapes, ctx.scale)
    gen = torch.Generator(ctx.device).manual_seed(0)
    base = [torch.randn(s, generator=gen, device=ctx.device).to(dtype) for s in shapes]
    ours, theirs = base, [t.clone() for t in base]
    found = torch.zeros((), device=ctx.device)
    # alternate 2^-16 and 2^16 so that the values never drift into subnormals over the reps,
    # and both kernels see the same sequence; neither is 1, which would skip the write
    invs = [torch.full((), 2.0 ** -16, device=ctx.device), torch.full((), 2.0 ** 16, device=ctx.device)]
    turn = {"fused_amp": 0, "torch": 0}

    def runner(impl, tensors, fn):
        def go():
            fn(tensors, found, invs[turn[impl] % 2])
            turn[impl] += 1
        return harness.Impl(impl, go)

    impls = [runner("fused_amp", ours, ops.unscale_),
             runner("torch", theirs, torch._amp_foreach_non_finite_check_and_unscale_)]
    times = harness.time_alternating(impls, ctx.device, ctx.reps)
    syncs = {i.name: {"host_syncs_per_step": harness.count_host_syncs(i.run, ctx.device)} for i in impls}
    return harness.make_records("unscale", f"{name}/{dtype_name}", ctx.device, dtype_name,
                                workloads.n_params(shapes), len(shapes), times, ctx.ceiling_gbps,
                                bytes_per_param("unscale", dtype_name), syncs)
