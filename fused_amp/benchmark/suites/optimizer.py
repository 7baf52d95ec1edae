"""One optimizer step (scaler step + update, grads given) for the three implementations."""
import torch

from fused_amp.benchmark import harness, impls, workloads
from fused_amp.benchmark.roofline import bytes_per_param


def cases(ctx):
    # a GPU's quick run keeps 100M+ params: the size the CUDA targets are stated for
    if ctx.device == "cpu":
        n = 16_000_000 if ctx.quick else 84_000_000
    else:
        n = 128_000_000 if ctx.quick else 300_000_000
    # Adam in both half dtypes; every other optimizer in bf16 (torch's side: its fused one, else
    # foreach; for Lion and AdEMAMix, which torch ships none of, a _foreach one as users write it);
    # a quick run (its minute's budget) takes the first five
    combos = ([("adam", "bfloat16"), ("adam", "float16")]
              + [(name, "bfloat16") for name in impls.OPTIMIZERS if name != "adam"])[:5 if ctx.quick else None]
    out = [(f"{opt}/{dtype}/{n // 1_000_000}M",
            lambda c, o=opt, d=dtype, n=n: run(c, o, d, workloads.model_like_shapes(n)))
           for opt, dtype in combos]
    # the usual recipe with clipping (max_norm 1.0; these random grads always clip)
    out.append((f"adam/bfloat16/{n // 1_000_000}M/clip",
                lambda c: run(c, "adam", "bfloat16", workloads.model_like_shapes(n), max_grad_norm=1.0)))
    out.append(("adam/bfloat16/10k-x-1k",
                lambda c: run(c, "adam", "bfloat16", workloads.many_small_shapes())))
    return out


def run(ctx, opt_name, dtype_name, shapes, suite="optimizer", case=None, max_grad_norm=None):
    shapes = workloads.scaled(shapes, ctx.scale)
    steps = impls.build_steps(shapes, opt_name, getattr(torch, dtype_name), ctx.device,
                              max_grad_norm=max_grad_norm)
    timed = [harness.Impl(name, step.step, (lambda s=step, p=pristine: impls.refresh_grads(s, p)))
             for name, (step, pristine) in steps.items()]
    times = harness.time_alternating(timed, ctx.device, ctx.reps)
    extra = {}
    for t in timed:
        step = steps[t.name][0]
        t.prepare()
        extra[t.name] = {"host_syncs_per_step": harness.count_host_syncs(t.run, ctx.device),
                         "held_bytes": harness.tensor_bytes(step.tensors())}
    n = workloads.n_params(shapes)
    clip = "/clip" if max_grad_norm is not None else ""
    case = case or f"{opt_name}/{dtype_name}/{_size_label(shapes, n)}{clip}"
    op = opt_name + ("_clip" if clip else "")
    return harness.make_records(suite, case, ctx.device, dtype_name, n, len(shapes), times,
                                ctx.ceiling_gbps, bytes_per_param(op, dtype_name), extra)


def _size_label(shapes, n):
    if len(shapes) >= 1000 and n // len(shapes) <= 10_000:
        return f"{len(shapes) // 1000}k-x-{n // len(shapes) // 1000}k"
    return f"{max(1, round(n / 1e6))}M"
