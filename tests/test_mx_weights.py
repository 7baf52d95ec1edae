"""MX (MXFP8) weight copies written by the step (ops.step_'s ``float8_weights`` with
``float8_e8m0fnu`` scales, fused_amp.float8.MXWeights): each copy and its block scales are
bitwise torchao's ``to_mx(p, torch.float8_e4m3fn, 32)`` of the param the step wrote, for every
optimizer of the registry and every storage kind, on every instruction set; the step is
otherwise unchanged; a skipped step writes nothing; bad input is refused before anything is
written; and a model trained on the copies matches the same recipe with torchao's cast as a pass
of its own. (The CUDA kernel's MX copies, under the emulator: test_cuda_sim.py.)"""
import pytest
import torch

import fused_amp
from fused_amp import ops
from fused_amp.float8 import Float8Weights, MXWeights, _mx_cast
from helpers import assert_bitwise_equal
from test_float8_weights import (DTYPES, STORAGE, bits, every_optimizer_storage_and_thread_count, give_grads,
                                 mlp, num_threads, on_every_instruction_set, optimizer_twins)

to_mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor").to_mx

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu
# one block; a vector step's blocks and a scalar tail's; a quant block's edge and an fp8 part's
# (2,048 elements); and one param that two threads split
SHAPES = [(1, 32), (3, 96), (9, 480), (4, 1056), (70, 1024)]


def torchao_cast(p):
    """torchao's MXFP8 cast of a weight: (e4m3 codes, e8m0 scales). (It takes bf16 or fp32; an
    fp16 param's values are the same as fp32.)"""
    x = p.detach()
    scales, data = to_mx(x if x.dtype != torch.float16 else x.float(), E4M3, 32)
    return data, scales


def mx_bits(data, scales):
    """The codes and the scales as bytes; any e4m3 NaN code as the positive one (a NaN's sign is
    the conversions' to lose: test_float8_weights.py's edge test)."""
    codes = bits(data).clone()
    codes[codes & 0x7f == 0x7f] = 0x7f
    return codes, scales.view(torch.uint8)


def spread(shape, dtype, gen):
    """N(0, 1) values whose blocks of 32 span many powers of two (so the blocks' scales differ),
    one block of zeros."""
    x = torch.randn(shape, generator=gen)
    blocks = x.reshape(-1, 32)
    blocks.mul_(torch.exp2(torch.randint(-12, 12, (blocks.shape[0], 1), generator=gen).float()))
    blocks[0] = 0.0
    return x.to(dtype)


@every_optimizer_storage_and_thread_count
def test_the_step_writes_torchaos_mx_cast_of_the_params_it_wrote(cls, torch_cls, kw, storage, threads):
    gen = torch.Generator().manual_seed(5)
    dtype = STORAGE[storage][0]
    values = [spread(shape, dtype, gen) for shape in SHAPES]
    grads = [torch.randn(shape, generator=gen).to(dtype) for shape in SHAPES]
    params, twins, opt, twin = optimizer_twins(cls, kw, storage, values)
    copies = MXWeights(opt, params)
    for i, p in enumerate(params):  # the copies start as the cast of the params
        assert [*map(torch.equal, mx_bits(*copies.weight(p)), mx_bits(*torchao_cast(p)))] == [True, True], i
    with num_threads(threads):
        for step, found in enumerate([0.0, 1.0, 0.0]):
            give_grads((opt, twin), grads, found)
            before = [bits(t).clone() for t in copies.data + copies.scales]
            opt.step()
            twin.step()
            for i, (p, t) in enumerate(zip(params, twins)):
                assert_bitwise_equal(p.detach(), t.detach(), f"param {i}: the copy changed the step")
            if found:  # skipped: no copy, no scale written
                for b, t in zip(before, copies.data + copies.scales):
                    assert_bitwise_equal(bits(t), b, f"step {step} (skipped)")
                continue
            for i, p in enumerate(params):
                ours, theirs = mx_bits(*copies.weight(p)), mx_bits(*torchao_cast(p))
                assert_bitwise_equal(ours[1], theirs[1], f"param {i}'s scales, step {step}")
                assert_bitwise_equal(ours[0], theirs[0], f"param {i}'s codes, step {step}")


# Blocks whose scale and cast test each case: every e4m3 value and the ties between them (at the
# scale 2^0: the block's amax in [256, 512)), the amax at each power of two and just below it
# (the scale's floor), amaxes past e4m3's range after scaling (saturated at 448), fp32's largest
# and smallest values (scale codes 246 and 0, whose scale torchao takes as 2^-126), zeros, inf
# (code 247) and NaN (code 255: the block's finite values cast to 0); in vector bodies and
# scalar tails of every instruction set.
EDGE_SCRIPT = r"""
import sys, torch
from fused_amp import ops
from torchao.prototype.mx_formats.mx_tensor import to_mx
for name in sys.argv[1:]:  # one process for every dtype: its imports take most of its time
    dtype = getattr(torch, name)
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    ordered = codes[codes == codes].unique()
    values = torch.cat([ordered, (ordered[1:] + ordered[:-1]) / 2])
    values = torch.cat([values, -values])
    values = torch.cat([values, torch.full((-len(values) % 32,), 300.0)]).reshape(-1, 32)
    gen = torch.Generator().manual_seed(0)
    powers = torch.randn(80, 32, generator=gen)
    powers[:, 0] = 1.0
    powers *= torch.exp2(torch.arange(-40, 40).float()).reshape(-1, 1)
    below = torch.randn(80, 32, generator=gen).clamp(-1, 1) * torch.nextafter(torch.exp2(torch.arange(-40, 40).float()),
                                                                               torch.zeros(1)).reshape(-1, 1)
    special = torch.zeros(6, 32)
    special[0, 3] = float("inf")
    special[1, 5], special[1, 6] = float("nan"), 2.0
    special[2, 7] = torch.finfo(torch.float32).max
    special[3] = torch.randn(32, generator=gen) * 1e-39
    special[4, 9] = -float("inf")
    param = torch.cat([values, powers, below, special]).to(dtype)
    rows = param.shape[0]
    # blocks of 32 after each 32-element head that a misaligned view skips: a vector body and tail
    params = [param.clone(), torch.cat([torch.zeros(32, dtype=dtype), param.flatten()])[32:].reshape(rows, 32)]
    copies = [torch.empty(rows, 32, dtype=torch.float8_e4m3fn) for _ in params]
    scales = [torch.empty(rows, 1, dtype=torch.float8_e8m0fnu) for _ in params]
    ops.step_("sgd", params, [torch.zeros_like(p) for p in params], [], [], [], lr=0.0,
              hyper=dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False),
              float8_weights=copies, float8_scales=scales, float8_indices=[0, 1])
    for p, c, s in zip(params, copies, scales):
        ref_s, ref_c = to_mx(p if dtype != torch.float16 else p.float(), torch.float8_e4m3fn, 32)
        ours, ref = c.view(torch.uint8).clone(), ref_c.view(torch.uint8).clone()
        for x in (ours, ref):
            x[x & 0x7f == 0x7f] = 0x7f  # any NaN code is a NaN
        print(name, ours.numpy().tobytes().hex(), ref.numpy().tobytes().hex())
        print(name, s.view(torch.uint8).numpy().tobytes().hex(), ref_s.view(torch.uint8).numpy().tobytes().hex())
"""


def test_the_mx_cast_scales_rounds_and_saturates_as_torchao_on_every_instruction_set():
    """SGD at lr 0 writes each param as it was: its copy is then the cast of chosen blocks."""
    lines = list(on_every_instruction_set(EDGE_SCRIPT))
    # codes and scales of two params, per dtype and instruction set
    assert len(lines) % 12 == 0 and {dtype for _, dtype, _, _ in lines} == set(DTYPES)
    for isa, dtype, ours, theirs in lines:
        assert ours == theirs, f"{isa}, {dtype} params: the step's MX bytes differ from torchao's to_mx"


def test_the_initial_copies_are_torchaos_cast():
    gen = torch.Generator().manual_seed(1)
    x = spread((64, 64), torch.float32, gen)
    x[3, 0], x[5, 1], x[7, 2], x[9, 3] = float("nan"), float("inf"), torch.finfo(torch.float32).max, 1e-40
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        p = x.to(dtype)
        for ours, theirs in zip(mx_bits(*_mx_cast(p)), mx_bits(*torchao_cast(p))):
            assert_bitwise_equal(ours, theirs, str(dtype))


def mx_args(shapes=((4, 64), (2, 32), (3, 96))):
    params = [torch.randn(s).to(torch.bfloat16) for s in shapes]
    return dict(params=params, grads=[torch.randn_like(p) for p in params], master_params=[p.float() for p in params],
                states=[], steps=[], lr=0.1,
                hyper=dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False),
                float8_weights=[torch.zeros(s, dtype=E4M3) for s in shapes],
                float8_scales=[torch.zeros(*s[:-1], s[-1] // 32, dtype=torch.uint8).view(E8M0) for s in shapes],
                float8_scale_invs=[torch.empty(0) for _ in shapes], float8_indices=list(range(len(shapes))))


def refused(match, error=ValueError, shapes=((4, 64), (2, 32), (3, 96)), **changes):
    """The op refuses these MX arguments with `match` and writes nothing."""
    args = mx_args(shapes)
    for key, change in changes.items():
        args[key] = change(args[key]) if callable(change) else change
    written = [*args["params"], *args["master_params"], *args["float8_weights"], *args["float8_scales"]]
    before = [bits(t).clone() if t.dtype in (E4M3, E8M0) else t.clone() for t in written]
    with pytest.raises(error, match=match):
        ops.step_("sgd", *(args.pop(k) for k in ("params", "grads", "master_params", "states", "steps")), **args)
    for b, t in zip(before, written):
        assert_bitwise_equal(bits(t) if t.dtype in (E4M3, E8M0) else t, b)


def test_what_the_op_refuses_of_mx_copies_before_writing_anything():
    e8m0 = lambda *shape: torch.zeros(shape, dtype=torch.uint8).view(E8M0)  # noqa: E731
    refused(r"float8_scales\[1\] has shape \[2, 2\], expected a contiguous \[2, 1\]",
            float8_scales=lambda s: [s[0], e8m0(2, 2), s[2]])
    refused(r"float8_scales\[0\] has shape \[4, 2\], expected a contiguous \[4, 2\]",
            float8_scales=lambda s: [e8m0(2, 4).t()] + s[1:])
    refused(r"float8_scales\[1\] are MX block scales \(float8_e8m0fnu or uint8\) but the last dim of params\[1\] "
            r"\(shape \[2, 40\]\) is not a multiple of 32",
            params=lambda p: [p[0], torch.zeros(2, 40, dtype=torch.bfloat16), p[2]],
            grads=lambda g: [g[0], torch.zeros(2, 40, dtype=torch.bfloat16), g[2]],
            master_params=lambda m: [m[0], torch.zeros(2, 40), m[2]],
            float8_weights=lambda w: [w[0], torch.zeros(2, 40, dtype=E4M3), w[2]])
    transposed = torch.randn(64, 4).to(torch.bfloat16).t()
    refused(r"params\[0\] is laid out in another order than its shape's: its blocks of 32 run along its last dim",
            params=lambda p: [transposed] + p[1:])
    refused(r"float8_scale_invs\[2\] must be empty: float8_scales\[2\] are MX block scales",
            float8_scale_invs=lambda s: s[:2] + [torch.zeros(1)])
    shared = e8m0(4, 2)
    refused(r"float8_scales\[0\] and float8_scales\[2\] are the same memory", shapes=((4, 64), (2, 32), (4, 64)),
            float8_scales=lambda s: [shared, s[1], shared])


def test_what_mx_copies_refuse():
    model = torch.nn.Linear(64, 8)
    opt = fused_amp.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match=r"MXWeights: params\[0\] \(shape \(8,\)\) must be contiguous with a last dim "
                                         r"that is a multiple of 32"):
        MXWeights(opt, [model.bias])
    with pytest.raises(ValueError, match="Muon writes its 2-D params in a pass of its own"):
        MXWeights(fused_amp.optim.Muon([model.weight]), [model.weight])
    MXWeights(opt, [model.weight])
    with pytest.raises(ValueError, match=r"params\[0\] already has fp8 copies"):
        Float8Weights(opt, [model.weight])


def test_mx_and_delayed_copies_step_together():
    """One step writes both kinds (the MX copies pass an empty inverse beside the delayed ones')."""
    a, b = torch.nn.Parameter(torch.randn(8, 64).bfloat16()), torch.nn.Parameter(torch.randn(8, 64).bfloat16())
    opt = fused_amp.optim.AdamW([a, b], lr=0.1)
    mx, delayed = MXWeights(opt, [a]), Float8Weights(opt, [b], amax_history_len=2)
    for p in (a, b):
        p.grad = torch.randn(8, 64).bfloat16()
    scale = delayed.scale[0].clone()
    opt.step()
    for ours, theirs in zip(mx_bits(*mx.weight(a)), mx_bits(*torchao_cast(a))):
        assert_bitwise_equal(ours, theirs)
    assert_bitwise_equal(bits(delayed.weight(b)[0]), bits((b.detach().float() * scale).clamp(-448, 448).to(E4M3)))
    assert_bitwise_equal(delayed.amax_history[-1, 0], b.detach().abs().max().float())


def test_a_checkpoint_restores_the_copies():
    w = torch.nn.Parameter(torch.randn(4, 64).bfloat16())
    opt = fused_amp.optim.AdamW([w], lr=0.1)
    copies = MXWeights(opt, [w])
    saved = {k: [t.clone() for t in v] for k, v in copies.state_dict().items()}
    w.grad = torch.randn(4, 64).bfloat16()
    opt.step()
    assert not torch.equal(bits(copies.data[0]), bits(saved["data"][0]))
    copies.load_state_dict(saved)
    assert_bitwise_equal(bits(copies.data[0]), bits(saved["data"][0]))
    assert_bitwise_equal(bits(copies.scales[0]), bits(saved["scales"][0]))


# ---- MX training, end to end -----------------------------------------------------------------

def dequantized(codes, scales):
    """An MX weight's values: each block of 32 codes times 2^(its scale - 127)."""
    factor = torch.exp2(scales.view(torch.uint8).float() - 127.0).repeat_interleave(32, dim=-1)
    return (codes.float() * factor).to(torch.bfloat16)


def train(use_copies, seed, steps=12):
    """A two-layer MLP whose forward runs on MXFP8 weights (dequantized: MX matmuls need an sm100
    GPU), AdamW on bf16 weights with fp32 masters. use_copies: the step writes the copies
    (MXWeights); else torchao's to_mx as a pass of its own after each step."""
    w1, w2, opt, data = mlp(seed, 32, 64, steps)
    copies = MXWeights(opt, [w1, w2]) if use_copies else None
    losses = []
    for x, target in data:
        w1_mx, w2_mx = ((dequantized(*copies.weight(w)) for w in (w1, w2)) if use_copies
                        else (dequantized(*torchao_cast(w)) for w in (w1, w2)))
        # forward on the MX weights; the grads through the bf16 weights (a straight-through estimator)
        h = torch.relu(x @ w1_mx.t() + (x @ w1.t() - (x @ w1.t()).detach()))
        y = h.detach() @ w2_mx.t() + (h @ w2.t() - (h @ w2.t()).detach())
        loss = (y.float() - target).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_on_mx_copies_matches_torchaos_cast_as_a_pass_of_its_own(seed):
    ours, theirs = train(True, seed), train(False, seed)
    assert ours == theirs
    assert ours[-1] < ours[0]  # (it learns: the MX path is not a constant)
