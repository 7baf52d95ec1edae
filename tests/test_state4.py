"""4-bit blockwise optimizer state (state_dtype=torch.uint4): the maps, block size and rounding
are torchao.optim's AdamW4bit's (checked against torchao's own code); checkpoints hold fp32
moments, and compact ones the codes; bad input is refused. What 4-bit state shares with 8-bit
state is tested with it, for every optimizer and option set (tests/test_quantized_state.py):
the step is the fp32-state step from the dequantized state, bit for bit, storing the codes
fused_amp/optim/_quantize.py makes of its fp32 state; overflow steps; thread counts; sizes."""
import math

import pytest
import torch

import fused_amp
from fused_amp.optim import AdamW
from fused_amp.optim._quantize import ABSMAX, QUANT4_BLOCK, constant_code, dequantize, quantize
from helpers import assert_bitwise_equal
from test_quantized_state import SIGNED, set_grads, state_keys
from test_quantized_state import make_params as make_params8

# sizes around the block: two elements, an odd tail, one block, blocks and a tail, a 3-d param
SHAPES = [(2,), (7,), (QUANT4_BLOCK,), (64, 33), (3, 5, 9), (1001,)]


def make_params(dtype, shapes=SHAPES, seed=0):
    return make_params8(dtype, shapes, seed)


torchao_quant = pytest.importorskip("torchao.optim.quant_utils")
torchao_4bit = pytest.importorskip("torchao.optim.subclass_4bit")


@pytest.mark.parametrize("signed", [True, False])
def test_the_maps_and_rounding_are_torchaos(signed):
    """Every code dequantizes to torchao's map entry times the absmax; quantizing random blocks
    gives torchao's codes (its quantize_4bit_with_qmap of x / absmax, blocks of 128) except where
    x / absmax and x * (1 / absmax) fall on two sides of a midpoint (a rounding apart)."""
    qmap = torch.tensor(torchao_4bit.get_qmap_signed() if signed else torchao_4bit.get_qmap_unsigned())
    codes = torch.tensor([c << 4 | (15 - c) for c in range(16)] * 4, dtype=torch.uint8)  # 128 codes
    like = torch.empty(QUANT4_BLOCK)
    for absmax in (1.0, 3.5e-3, 7.25e12):
        values = dequantize(codes, torch.tensor([absmax]), signed, like)
        expected = qmap[torch.stack([codes >> 4, codes & 15], -1).reshape(-1).long()] * absmax
        assert_bitwise_equal(values, expected, f"absmax {absmax}")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64 * QUANT4_BLOCK, generator=gen) ** 3
    if not signed:
        x = x.abs()
    ours, absmax = quantize(x, x, signed, torch.uint4)
    scale = x.view(-1, QUANT4_BLOCK).abs().amax(-1)
    assert_bitwise_equal(absmax, scale)
    unit = (x.view(-1, QUANT4_BLOCK) / scale[:, None]).reshape(-1)
    theirs = torchao_quant.quantize_4bit_with_qmap(unit, qmap)
    mine = torch.stack([ours >> 4, ours & 15], -1).reshape(-1)
    differ = (mine != theirs).nonzero().reshape(-1)
    assert differ.numel() <= 2, differ
    mids = (qmap[:-1] + qmap[1:]) / 2
    for i in differ.tolist():
        assert (mids - unit[i]).abs().min() < 1e-6, (i, unit[i])


@pytest.mark.parametrize("signed", [True, False])
def test_a_constant_state_codes_as_quantize_codes_it(signed):
    """constant_code (new state at its initial value, without tensors for torch.compile) is
    quantize's code and absmax for a constant tensor, an odd length's last half byte 0."""
    n = 2 * QUANT4_BLOCK + 5
    for value in (0.0, 1.0, 3.0, 0.1, 1e-39, 7e30) + ((-2.5,) if signed else ()):
        codes, absmax = quantize(torch.full((n,), value), torch.empty(n), signed, torch.uint4)
        code, a = constant_code(value, signed, torch.uint4)
        assert_bitwise_equal(codes, fused_amp.optim._quantize.codes4_full(code, n, "cpu"), f"value {value}")
        assert_bitwise_equal(absmax, torch.full_like(absmax, a), f"value {value}")


def test_nonfinite_state_reads_back_as_nan_and_tiny_blocks_as_zero():
    x = torch.ones(2 * QUANT4_BLOCK)
    x[5] = math.inf
    x[QUANT4_BLOCK:] = 1e-39  # below FLT_MIN: stored as zeros
    for signed in (True, False):
        codes, absmax = quantize(x, x, signed, torch.uint4)
        back = dequantize(codes, absmax, signed, x)
        assert back[:QUANT4_BLOCK].isnan().all()
        assert (back[QUANT4_BLOCK:] == 0).all() and absmax[1] == 0


def test_checkpoints_hold_fp32_moments_and_load_as_their_codes():
    """state_dict() holds the dequantized moments, which torch.optim.AdamW loads; loading them
    back gives the codes quantize makes of them, and training goes on from there."""
    params = make_params(torch.bfloat16, [(300,), (20, 30)])
    opt = AdamW(params, lr=1e-3, state_dtype=torch.uint4, min_8bit_size=0)
    for step in range(3):
        set_grads(params, step)
        opt.step()
    sd = opt.state_dict()
    for i, p in enumerate(params):
        for row, key in enumerate(state_keys(opt, p)):
            held = dequantize(opt.state[p][key], opt.state[p][ABSMAX][row], SIGNED[key], p.detach())
            assert_bitwise_equal(sd["state"][i][key], held, key)
    torch.optim.AdamW([torch.nn.Parameter(p.detach().float()) for p in params]).load_state_dict(sd)
    again_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    again = AdamW(again_params, lr=1e-3, state_dtype=torch.uint4, min_8bit_size=0)
    again.load_state_dict(sd)
    for i, p in enumerate(again_params):
        for row, key in enumerate(state_keys(again, p)):
            codes, absmax = quantize(sd["state"][i][key], p, SIGNED[key], torch.uint4)
            assert_bitwise_equal(again.state[p][key], codes, key)
            assert_bitwise_equal(again.state[p][ABSMAX][row], absmax, key)
    set_grads(again_params, 3)
    again.step()


def test_bad_input_is_refused_naming_the_argument():
    p = torch.nn.Parameter(torch.randn(300))
    opt = AdamW([p], state_dtype=torch.uint4, min_8bit_size=0, stochastic_rounding=None)
    with pytest.raises(ValueError, match="stochastic_rounding=True"):
        AdamW([p], state_dtype=torch.uint4, stochastic_rounding=True)
    p.grad = torch.randn(300)
    opt.step()
    state = opt.state[p]
    before = p.detach().clone()
    absmax = state[ABSMAX]
    step = state["step"].reshape(1)
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False,
                 decoupled_weight_decay=True)
    with pytest.raises(ValueError, match=r"exp_avg_sqs\[0\] holds 4-bit codes .* expected a contiguous 1-D uint8 "
                                         r"tensor of 150 bytes, got shape \[149\]"):
        fused_amp.ops.step_("adam", [p.detach()], [p.grad], [], [[state["exp_avg"]], [state["exp_avg_sq"][:149]]],
                            [step], state_absmaxes=[absmax], hyper=hyper)
    with pytest.raises(ValueError, match=r"state_absmaxes\[0\] has shape \[2, 2\], expected \[2, 3\] .*block of 128"):
        fused_amp.ops.step_("adam", [p.detach()], [p.grad], [], [[state["exp_avg"]], [state["exp_avg_sq"]]],
                            [step], state_absmaxes=[absmax[:, :2].contiguous()], hyper=hyper)
    assert_bitwise_equal(p.detach(), before)


def test_a_compact_checkpoint_holds_the_codes_and_resumes_bit_for_bit():
    """state_dict(compact=True) keeps the 4-bit codes and absmax; they load as they are (the
    signed map has no -1, so codes dequantized and quantized again could differ) and the next
    steps are bitwise those of the optimizer that saved them; an 8-bit optimizer loads them as
    the fp32 moments they hold."""
    params = make_params(torch.bfloat16, [(300,), (20, 30), (5,)])
    opt = AdamW(params, lr=1e-2, state_dtype=torch.uint4, min_8bit_size=0, master_weights="remainder")
    for step in range(3):
        set_grads(params, step)
        opt.step()
    compact = opt.state_dict(compact=True)
    assert compact["state"][0]["exp_avg"].shape == (150,) and ABSMAX in compact["state"][0]
    again_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    again = AdamW(again_params, lr=1e-2, state_dtype=torch.uint4, min_8bit_size=0, master_weights="remainder")
    again.load_state_dict(compact)
    for step in (3, 4):
        set_grads(params, step)
        set_grads(again_params, step)
        opt.step()
        again.step()
    for p, q in zip(params, again_params):
        assert_bitwise_equal(p.detach(), q.detach())
        for key in state_keys(opt, p) + [ABSMAX]:
            assert_bitwise_equal(opt.state[p][key], again.state[q][key], key)
    eight = AdamW([torch.nn.Parameter(p.detach().clone()) for p in params], state_dtype=torch.uint8, min_8bit_size=0)
    eight.load_state_dict(compact)
    q = eight.param_groups[0]["params"][1]
    signed = dequantize(compact["state"][1]["exp_avg"], compact["state"][1][ABSMAX][0], True, q.detach())
    assert_bitwise_equal(eight.state_dict()["state"][1]["exp_avg"],
                         dequantize(*quantize(signed, q, True), True))


def test_a_block_too_small_to_code_keeps_the_zero_code():
    """The kernels write a block whose absmax is below FLT_MIN as absmax 0 with the zero code in
    every element (the signed map's 7, the unsigned map's 0), the last byte of an odd element
    count 0 in its low half."""
    p = torch.nn.Parameter(torch.randn(301))  # blocks 0-127, 128-255 and 256-300 (45 elements)
    opt = AdamW([p], state_dtype=torch.uint4, min_8bit_size=0)
    grad = torch.randn(301)
    grad[128:] = 0
    p.grad = grad
    opt.step()
    state = opt.state[p]
    assert_bitwise_equal(state[ABSMAX][:, 1:], torch.zeros(2, 2))
    for key, pair in (("exp_avg", 0x77), ("exp_avg_sq", 0x00)):
        expected = torch.full((87,), pair, dtype=torch.uint8)
        expected[-1] = pair & 0xF0
        assert_bitwise_equal(state[key][64:], expected, key)
