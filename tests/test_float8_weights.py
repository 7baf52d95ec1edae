"""fp8 weight copies written by the step (ops.step_'s ``float8_weights``, fused_amp.float8):
each copy is bitwise torch's saturated e4m3 cast of the param the step wrote, times its scale
(torchao's cast, ``(p.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn)``), for every
optimizer of the registry and every storage kind, on every instruction set; the step is
otherwise unchanged; a skipped step writes nothing; bad input is refused before anything is
written; and a model trained on the copies with delayed scaling matches the same recipe with
torch's cast as a pass of its own. (The CUDA kernel's copies, under the emulator:
test_cuda_sim.py.)"""
import contextlib
import math
import os
import subprocess
import sys

import pytest
import torch

import fused_amp
from fused_amp import ops
from fused_amp.float8 import Float8Weights
from helpers import assert_bitwise_equal
from optim_registry import CASES, IDS, STORAGE
from test_delayed_scaling import reference

E4M3 = torch.float8_e4m3fn

# vector bodies, scalar tails, a quant block's edge, and one param that two threads split
SIZES = [1, 33, 257, 4099, 70000]
# scales that put the params (about N(0, 9)) in e4m3's normal range, its subnormals, and past
# its largest value (saturated)
SCALES = [1.0, 2.0 ** -9, 40.0, 0.37, 1e4]


def torch_cast(p, scale):
    """torchao's cast of a weight (hp_tensor_and_scale_to_float8 with to_fp8_saturated)."""
    return (p.detach().float() * scale).clamp(-448.0, 448.0).to(E4M3)


def bits(t):
    return t.view(torch.uint8)


def optimizer_twins(cls, kw, storage, values):
    """(params, twins, opt, twin): ``values`` as the params of ``cls`` with the storage kind's
    options, and twins of them stepped without copies."""
    if cls.__name__ == "Muon":
        pytest.skip("Muon writes its 2-D params in a pass of its own (refused: test_what_the_copies_refuse)")
    options = STORAGE[storage][1]
    params, twins = ([torch.nn.Parameter(v.clone()) for v in values] for _ in range(2))
    return params, twins, cls(params, **kw, **options), cls(twins, **kw, **options)


def give_grads(optimizers, grads, found):
    """Copies of ``grads`` to each optimizer's params, and ``found`` as its scaler's found_inf."""
    for o in optimizers:
        for p, g in zip(o.param_groups[0]["params"], grads):
            p.grad = g.clone()
        o.found_inf, o.grad_scale = torch.tensor(found), torch.tensor(1.0)


def every_optimizer_storage_and_thread_count(test):
    """Parametrized over the registry's optimizers, the storage kinds and 1 and 2 threads."""
    test = pytest.mark.parametrize("cls,torch_cls,kw", CASES, ids=IDS)(test)
    test = pytest.mark.parametrize("storage", list(STORAGE))(test)
    return pytest.mark.parametrize("threads", [1, 2])(test)


@contextlib.contextmanager
def num_threads(n):
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@every_optimizer_storage_and_thread_count
def test_the_step_writes_torchs_cast_of_the_params_it_wrote(cls, torch_cls, kw, storage, threads):
    gen = torch.Generator().manual_seed(3)
    dtype = STORAGE[storage][0]
    values = [(torch.randn(n, generator=gen) * 3).to(dtype) for n in SIZES]
    grads = [torch.randn(n, generator=gen).to(dtype) for n in SIZES]
    params, twins, opt, twin = optimizer_twins(cls, kw, storage, values)
    copies = Float8Weights(opt, params, amax_history_len=3)
    with num_threads(threads):
        for step, found in enumerate([0.0, 0.0, 1.0, 0.0]):
            give_grads((opt, twin), grads, found)
            copies.scale.copy_(torch.tensor(SCALES) * (step + 1))  # as if the update had set them
            before = [bits(d).clone() for d in copies.data] + [copies.amax_history.clone(), copies.scale_inv.clone()]
            opt.step()
            twin.step()
            for i, (p, t) in enumerate(zip(params, twins)):
                assert_bitwise_equal(p.detach(), t.detach(), f"param {i}: the copy changed the step")
            if found:  # skipped: no copy, no inverse, no amax, no scale moved
                after = [bits(d) for d in copies.data] + [copies.amax_history, copies.scale_inv]
                for b, a in zip(before, after):
                    assert_bitwise_equal(a, b, f"step {step} (skipped)")
                assert_bitwise_equal(copies.scale, torch.tensor(SCALES) * (step + 1))
                continue
            for i, p in enumerate(params):
                scale = SCALES[i] * (step + 1)
                assert_bitwise_equal(bits(copies.data[i]), bits(torch_cast(p, scale)), f"copy {i}, step {step}")
                assert_bitwise_equal(copies.scale_inv[i], torch.tensor(1.0) / scale, f"scale_inv {i}")
            # the amax the step recorded is the newest history entry (the update rolled it there)
            amax = torch.stack(torch._foreach_norm([p.detach() for p in params], ord=math.inf)).float()
            assert_bitwise_equal(copies.amax_history[-1], amax, f"step {step}'s amax")


# Values whose cast tests each rounding case: every e4m3 value, the ties between neighbours
# (to even) and just off them, subnormal ties, the largest value, beyond it (saturated), inf,
# NaN and signed zeros: at every lane of a vector, in the scalar head and tail.
EDGE_SCRIPT = r"""
import sys, torch
from fused_amp import ops
for name in sys.argv[1:]:  # one process for every dtype: its imports take most of its time
    dtype = getattr(torch, name)
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    finite = codes[codes == codes]
    ordered = finite.unique()
    ties = (ordered[1:] + ordered[:-1]) / 2
    off = torch.cat([torch.nextafter(ties, ordered[1:]), torch.nextafter(ties, ordered[:-1])])
    special = torch.tensor([448.0, 464.0, 465.0, 1e30, float("inf"), float("nan"), 0.0, 2.0 ** -10, 3 * 2.0 ** -10])
    values = torch.cat([finite, ties, off, special])
    values = torch.cat([values, -values, torch.tensor([1.0])]).to(dtype)
    assert len(values) % 2  # (odd: its repeats put each value at every one of 16 lanes)
    param = values.repeat(17)
    # from offsets 0, 1 and 3: in the scalar head and tail too
    params = [param.clone()[offset:] for offset in (0, 1, 3)]
    copies = [torch.empty(len(param), dtype=torch.float8_e4m3fn)[offset:] for offset in (0, 1, 3)]
    scales = [torch.tensor([s]) for s in (1.0, 0.5, 3.0)]
    ops.step_("sgd", params, [torch.zeros_like(p) for p in params], [], [], [], lr=0.0,
              hyper=dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False),
              float8_weights=copies, float8_scales=scales, float8_indices=[0, 1, 2])
    for p, c, s in zip(params, copies, scales):
        ref = (p.float() * s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
        ours = c.view(torch.uint8).clone()
        # a NaN's sign is torch's to lose: its scalar fp16-to-fp32 conversion (a tensor's tail) gives
        # the positive NaN, its vector one keeps the sign; any NaN code is a NaN
        nan = (ours & 0x7f == 0x7f) & (ref & 0x7f == 0x7f)
        ours[nan] = ref[nan]
        print(name, ours.numpy().tobytes().hex(), ref.numpy().tobytes().hex())
"""


DTYPES = ["float32", "bfloat16", "float16"]


def on_every_instruction_set(script, dtypes=DTYPES):
    """(instruction set, dtype, ours, theirs) of each line `script` prints for `dtypes`, run with
    ATEN_CPU_CAPABILITY set to each instruction set of this CPU in turn (to the one the caller
    set, where it set one: make test-isas runs the numerics once per instruction set)."""
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    isas = ["default"] + [isa for isa, flag in (("avx2", " avx2"), ("avx512", " avx512bw")) if flag in flags]
    for isa in [os.environ["ATEN_CPU_CAPABILITY"]] if "ATEN_CPU_CAPABILITY" in os.environ else isas:
        out = subprocess.run([sys.executable, "-c", script, *dtypes], env=dict(os.environ, ATEN_CPU_CAPABILITY=isa),
                             capture_output=True, text=True, check=True).stdout
        yield from ((isa, *line.split()) for line in filter(None, out.split("\n")))


def test_the_cast_rounds_and_saturates_as_torch_on_every_instruction_set():
    """SGD at lr 0 writes each param as it was: its copy is then the cast of chosen values."""
    lines = list(on_every_instruction_set(EDGE_SCRIPT))
    assert {dtype for _, dtype, _, _ in lines} == set(DTYPES)
    for isa, dtype, ours, theirs in lines:
        assert ours == theirs, f"{isa}, {dtype} params: the step's e4m3 bytes differ from torch's cast"


def sgd_args(n=3, size=40, dtype=torch.bfloat16):
    params = [torch.randn(size).to(dtype) for _ in range(n)]
    return dict(params=params, grads=[torch.randn(size).to(dtype) for _ in range(n)],
                master_params=[p.float() for p in params] if dtype != torch.float32 else [], states=[], steps=[],
                hyper=dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False), lr=0.1)


def refused(match, error=ValueError, **changes):
    """The op refuses these arguments with `match` and writes nothing."""
    args = sgd_args()
    n = len(args["params"])
    args.update(float8_weights=[torch.zeros(40, dtype=E4M3) for _ in range(n)],
                float8_scales=[torch.ones(1) for _ in range(n)], float8_scale_invs=[torch.zeros(1) for _ in range(n)],
                float8_indices=list(range(n)))
    for key, change in changes.items():
        args[key] = change(args[key]) if callable(change) else change

    def written():
        return ([t for key in ("params", "master_params", "float8_scale_invs") for t in args[key]]
                + [bits(t) for t in args["float8_weights"]])

    before = [t.clone() for t in written()]
    with pytest.raises(error, match=match):
        ops.step_("sgd", args["params"], args["grads"], args["master_params"], args["states"], args["steps"],
                  **{k: v for k, v in args.items() if k not in ("params", "grads", "master_params", "states", "steps")})
    for b, a in zip(before, written()):
        assert_bitwise_equal(a, b)


def test_what_the_op_refuses_before_writing_anything():
    refused(r"float8_weights\[1\] has dtype Float8_e5m2, expected Float8_e4m3fn", TypeError,
            float8_weights=lambda w: [w[0], torch.zeros(40, dtype=torch.float8_e5m2), w[2]])
    refused(r"float8_weights\[0\] has shape \[41\] but params\[2\] has shape \[40\]", float8_indices=[2, 0, 1],
            float8_weights=lambda w: [torch.zeros(41, dtype=E4M3)] + w[1:])
    refused(r"float8_weights has 2 tensors; float8_scales \(3\) and float8_indices \(3\) need as many",
            float8_weights=lambda w: w[:2])
    refused(r"float8_scale_invs has 2 tensors but float8_weights has 3", float8_scale_invs=lambda s: s[:2])
    refused(r"float8_indices\[2\] is 3, not the index of a param \(3 params\)", float8_indices=[0, 1, 3])
    refused(r"float8_indices\[2\] is 1 again", float8_indices=[0, 1, 1])
    refused(r"float8_scales\[1\] must have exactly one element", float8_scales=lambda s: [s[0], torch.ones(2), s[2]])
    refused(r"float8_scales\[0\] must be Float", TypeError, float8_scales=lambda s: [s[0].double()] + s[1:])
    shared = torch.ones(1)
    refused(r"float8_scale_invs\[0\] shares memory with float8_scales\[0\]",
            float8_scales=lambda s: [shared] + s[1:], float8_scale_invs=lambda s: [shared] + s[1:])
    twice = torch.zeros(1)
    refused(r"float8_scale_invs", float8_scale_invs=lambda s: [twice, twice, s[2]])


def test_an_optimizer_that_writes_outputs_takes_no_copy():
    p = torch.randn(4, 4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"float8_weights are given but the step writes no param"):
        ops.step_("muon_momentum", [p], [torch.randn(4, 4, dtype=torch.bfloat16)], [], [[torch.zeros(4, 4)]], [],
                  outputs=[torch.empty(4, 4, dtype=torch.bfloat16)], float8_weights=[torch.empty(4, 4, dtype=E4M3)],
                  float8_scales=[torch.ones(1)], float8_indices=[0], hyper=dict(momentum=0.95, nesterov=True), lr=0.0)


def test_copies_in_another_layout_than_their_param_are_written_through_a_staged_copy():
    param = torch.randn(24, 40).to(torch.bfloat16).t()  # (40, 24), transposed
    copy = torch.empty(40, 24, dtype=E4M3)  # contiguous: another layout than the param
    ops.step_("sgd", [param], [torch.randn(40, 24).to(torch.bfloat16)], [param.float()], [], [],
              hyper=dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False), lr=0.1,
              float8_weights=[copy], float8_scales=[torch.tensor([7.0])], float8_indices=[0])
    assert_bitwise_equal(bits(copy), bits(torch_cast(param, 7.0)))


def test_what_the_copies_refuse():
    model = torch.nn.Linear(8, 8)
    opt = fused_amp.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match=r"params\[0\] is not a param of the optimizer"):
        Float8Weights(opt, [torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(ValueError, match="amax_compute_algo must be 'max' or 'most_recent'"):
        Float8Weights(opt, [model.weight], amax_compute_algo="mean")
    Float8Weights(opt, [model.weight])
    with pytest.raises(ValueError, match=r"params\[0\] already has fp8 copies"):
        Float8Weights(opt, [model.weight])
    with pytest.raises(ValueError, match="Muon writes its 2-D params in a pass of its own"):
        Float8Weights(fused_amp.optim.Muon([model.weight]), [model.weight])
    with pytest.raises(TypeError, match="must be a fused_amp.optim optimizer"):
        Float8Weights(torch.optim.AdamW(model.parameters()), [model.weight])


# ---- delayed scaling, end to end -------------------------------------------------------------

def reference_delayed_update(history, scale):
    """TE's DelayedScaling update ("max", no margin): test_delayed_scaling.py's reference."""
    histories, scales, _ = reference([history], [scale], 448.0, 0.0, "max")
    history.copy_(histories[0])
    scale.copy_(scales[0])


def scaled_linear(x, w8, w_scale_inv):
    """y = x @ w.T with both operands in e4m3: x cast with its own amax (tensorwise)."""
    x_scale = 448.0 / x.abs().max().float().clamp(min=1e-12)
    x8 = (x.float() * x_scale).clamp(-448.0, 448.0).to(E4M3)
    return torch._scaled_mm(x8, w8.t(), scale_a=(1.0 / x_scale).reshape(()), scale_b=w_scale_inv.reshape(()),
                            out_dtype=torch.bfloat16)


def mlp(seed, width, hidden, steps):
    """A two-layer MLP's bf16 weights, (hidden, width) and (width, hidden), AdamW with fp32
    masters over them, and `steps` batches of 16 (input, target) pairs."""
    gen = torch.Generator().manual_seed(seed)
    w1 = torch.nn.Parameter((torch.randn(hidden, width, generator=gen) * 0.3).to(torch.bfloat16))
    w2 = torch.nn.Parameter((torch.randn(width, hidden, generator=gen) * 0.3).to(torch.bfloat16))
    data = [(torch.randn(16, width, generator=gen).to(torch.bfloat16), torch.randn(16, width, generator=gen))
            for _ in range(steps)]
    return w1, w2, fused_amp.optim.AdamW([w1, w2], lr=3e-2), data


def train(use_copies, seed, steps=12):
    """A two-layer MLP whose linears run on fp8 weights, AdamW on bf16 weights with fp32 masters.
    use_copies: the step writes the copies (Float8Weights); else the same recipe with the cast,
    the amax and the update as passes of their own (torch's ops, the reference update)."""
    w1, w2, opt, data = mlp(seed, 16, 32, steps)
    if use_copies:
        copies = Float8Weights(opt, [w1, w2], amax_history_len=4)
    else:  # the same start: the params' amax, one update, the cast
        history, scale = torch.zeros(4, 2), torch.ones(2)
        history[0] = torch.stack([w1.detach().abs().max().float(), w2.detach().abs().max().float()])
        reference_delayed_update(history, scale)
        weights = [torch_cast(w, scale[i]) for i, w in enumerate((w1, w2))]
        scale_inv = torch.reciprocal(scale)
    losses = []
    for x, target in data:
        pairs = ([copies.weight(w1), copies.weight(w2)] if use_copies
                 else [(weights[0], scale_inv[0]), (weights[1], scale_inv[1])])
        # forward in fp8; the grads through the bf16 matmuls (a straight-through estimator)
        h = torch.relu(scaled_linear(x, *pairs[0]) + (x @ w1.t() - (x @ w1.t()).detach()))
        y = scaled_linear(h.detach(), *pairs[1]) + (h @ w2.t() - (h @ w2.t()).detach())
        loss = (y.float() - target).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if not use_copies:
            cast_scale = scale.clone()
            weights = [torch_cast(w, cast_scale[i]) for i, w in enumerate((w1, w2))]
            scale_inv = torch.reciprocal(cast_scale)
            history[0] = torch.stack([w1.detach().abs().max().float(), w2.detach().abs().max().float()])
            reference_delayed_update(history, scale)
    return losses, (copies.scale if use_copies else scale)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_on_the_copies_matches_the_cast_as_a_pass_of_its_own(seed):
    ours, our_scale = train(True, seed)
    theirs, their_scale = train(False, seed)
    assert ours == theirs
    assert_bitwise_equal(our_scale, their_scale)
    assert ours[-1] < ours[0]  # (it learns: the fp8 path is not a constant)
