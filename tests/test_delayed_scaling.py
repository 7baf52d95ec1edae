"""fp8 delayed scaling (ops.delayed_scale_update_) bitwise against a reference written from
TransformerEngine's recipe documentation (DelayedScaling; amax_and_scale_update_after_reduction),
with the inf, NaN, zero and tiny amaxes TE's kernel handles, and its bad input refused. (The CUDA
kernel under the emulator: test_cuda_sim.py; captured in a CUDA graph: test_cuda.py.)"""
import math

import pytest
import torch

from fused_amp import ops
from helpers import assert_bitwise_equal

E4M3_MAX, E5M2_MAX = 448.0, 57344.0
FLT_MAX = torch.finfo(torch.float32).max


def f32(x):
    return torch.tensor(x, dtype=torch.float32)


def reference(histories, scales, fp8_max, margin, algo, reduced=None):
    """The recipe, one column at a time. Row 0 holds the amax since the last update (the
    reduction buffer's, where given and nonzero, stands for it). A zero amax leaves the column's
    history alone; otherwise the history rolls: [a_new, a_1, ..., a_{L-1}] becomes
    [0, a_2, ..., a_{L-1}, a_new], and the amax for the scale is the largest of a_new, a_1, ...,
    a_{L-1} (NaN ignored, as fmaxf) or a_new alone ("most_recent"). The scale is
    fp8_max * 2^-margin / amax in fp32 where amax is finite and positive, else the old scale; an
    infinite scale becomes FLT_MAX; scale_inv = 1 / scale."""
    scaled_max = f32(fp8_max) * torch.pow(f32(2.0), f32(-margin))
    histories = [h.clone() for h in histories]
    scales = [s.clone() for s in scales]
    scale_invs = []
    offset = 0
    for h, s in zip(histories, scales):
        length, n = h.shape
        for c in range(n):
            column = h[:, c].tolist()
            new = column[0]
            if reduced is not None and reduced[offset + c].item() != 0:
                new = reduced[offset + c].item()
            amax = 0.0
            if new != 0:  # (a NaN amax is not 0: it rolls in)
                window = column[1:] + [new]
                amax = max([0.0] + [v for v in window if not math.isnan(v)])
                h[:, c] = torch.tensor([0.0] + window[1:], dtype=torch.float32) if length > 1 else 0.0
            if algo == "most_recent":
                amax = new
            scale = scaled_max / f32(amax) if math.isfinite(amax) and amax > 0 else s[c].clone()
            if torch.isinf(scale):
                scale = f32(FLT_MAX)
            s[c] = scale
        scale_invs.append(f32(1.0) / s)
        offset += n
    return histories, scales, scale_invs


def cases(gen, length, columns):
    """Histories with every kind of amax: ordinary ones, zeros (a tensor not used this step),
    inf, NaN (in the past and as the new amax), and tiny ones whose scale overflows fp32."""
    histories, scales = [], []
    for n in columns:
        h = torch.rand(length, n, generator=gen) * 10.0 ** torch.randint(-3, 4, (length, n), generator=gen)
        if n:
            h[0, 0] = 0.0  # not used this step: no roll
        if n > 3:
            h[0, 1] = math.nan
            h[0, 2] = math.inf
            h[0, 3] = 1e-41  # scale beyond fp32: FLT_MAX
        if n > 5 and length > 1:
            h[-1, 4] = math.nan  # a NaN in the past: ignored by "max"
            h[length // 2, 5] = math.inf
        histories.append(h)
        scales.append(torch.rand(n, generator=gen) + 0.5)
    return histories, scales


@pytest.mark.parametrize("length", [1, 2, 16])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("fp8_max,margin", [(E4M3_MAX, 0.0), (E5M2_MAX, 1.0), (E4M3_MAX, 2.5)])
@pytest.mark.parametrize("reduction", [False, True])
def test_matches_the_recipe_bitwise(length, algo, fp8_max, margin, reduction):
    gen = torch.Generator().manual_seed(length)
    histories, scales = cases(gen, length, [7, 0, 1, 12])
    reduced = None
    if reduction:  # the all-reduced amaxes: some zero (row 0 stays the amax), some another value
        reduced = torch.rand(20, generator=gen) * 5
        reduced[::3] = 0.0
    want = reference(histories, scales, fp8_max, margin, algo, reduced)
    scale_invs = [torch.full_like(s, -1.0) for s in scales]
    for _ in range(3):  # three updates in a row (the later ones see rolled histories)
        ops.delayed_scale_update_(histories, scales, scale_invs, fp8_max=fp8_max, margin=margin,
                                  amax_compute_algo=algo, amax_reduction_buffer=reduced)
        for got, expected in zip(histories + scales + scale_invs, want[0] + want[1] + want[2]):
            assert_bitwise_equal(got, expected)
        want = reference(want[0], want[1], fp8_max, margin, algo, reduced)


def test_a_column_not_used_keeps_its_history_and_scale():
    history = torch.tensor([[0.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    scale, scale_inv = torch.tensor([7.0, 1.0]), torch.zeros(2)
    ops.delayed_scale_update_([history], [scale], [scale_inv], fp8_max=E4M3_MAX)
    assert history[:, 0].tolist() == [0.0, 3.0, 5.0] and scale[0].item() == 7.0
    assert history[:, 1].tolist() == [0.0, 6.0, 2.0] and scale[1].item() == (f32(E4M3_MAX) / f32(6.0)).item()
    assert scale_inv.tolist() == [f32(1.0).div(f32(7.0)).item(), f32(1.0).div(scale[1]).item()]


@pytest.mark.parametrize("change,message", [
    (dict(amax_compute_algo="mean"), 'amax_compute_algo must be "max" or "most_recent"'),
    (dict(fp8_max=0.0), "fp8_max must be a positive"),
    (dict(fp8_max=1e300), "fp8_max must be a positive"),
    (dict(margin=math.inf), "margin must be a finite"),
    (dict(margin=200.0), "fp8_max \\* 2\\^-margin must be"),
    (dict(histories=[torch.zeros(2, 3), torch.zeros(3, 1)]), "one history length for all"),
    (dict(histories=[torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 1)]), "must be float32"),
    (dict(histories=[torch.zeros(6), torch.zeros(2, 1)]), "history length, scales"),
    (dict(scales=[torch.ones(2), torch.ones(1)]), "scales\\[0\\] must be contiguous with 3 elements"),
    (dict(scale_invs=[torch.ones(3)]), "scale_invs has 1 tensors"),
    (dict(amax_reduction_buffer=torch.zeros(3)), "amax_reduction_buffer must be a contiguous 1-D tensor"),
])
def test_bad_input_is_refused_before_anything_is_written(change, message):
    args = dict(histories=[torch.ones(2, 3), torch.ones(2, 1)], scales=[torch.ones(3), torch.ones(1)],
                scale_invs=[torch.ones(3), torch.ones(1)], fp8_max=E4M3_MAX, margin=0.0, amax_compute_algo="max",
                amax_reduction_buffer=None)
    args.update(change)
    histories, scales, scale_invs = args.pop("histories"), args.pop("scales"), args.pop("scale_invs")
    before = [t.clone() for t in histories + scales + scale_invs]
    with pytest.raises((ValueError, TypeError), match=message):
        ops.delayed_scale_update_(histories, scales, scale_invs, **args)
    for t, b in zip(histories + scales + scale_invs, before):
        assert_bitwise_equal(t, b)
