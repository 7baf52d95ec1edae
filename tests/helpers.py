"""Comparison helpers shared by the tests."""
import torch

_INT_VIEW = {torch.float32: torch.int32, torch.float64: torch.int64,
             torch.float16: torch.int16, torch.bfloat16: torch.int16}


def assert_bitwise_equal(actual, expected, msg=""):
    """Same bits everywhere, except that NaN only has to meet NaN (payloads may differ)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, msg
    if actual.dtype not in _INT_VIEW:
        assert torch.equal(actual, expected), msg
        return
    nan_a, nan_e = torch.isnan(actual), torch.isnan(expected)
    assert torch.equal(nan_a, nan_e), f"{msg}: NaN positions differ"
    a = actual.masked_fill(nan_a, 0).view(_INT_VIEW[actual.dtype])
    e = expected.masked_fill(nan_e, 0).view(_INT_VIEW[expected.dtype])
    bad = (a != e).nonzero()
    assert bad.numel() == 0, (f"{msg}: {bad.shape[0]} elements differ, first at {bad[0].tolist()}: "
                              f"{actual[tuple(bad[0])]} vs {expected[tuple(bad[0])]}")


def bf16_ties_away(values):
    """fp32 values rounded to bf16 to nearest, ties away from zero (the remainder mode's param):
    half a bf16 ulp added to the magnitude bits, the low half dropped."""
    high = ((values.view(torch.int32).to(torch.int64) & 0xffffffff) + 0x8000) >> 16
    return (((high + 0x8000) % 0x10000) - 0x8000).to(torch.int16).view(torch.bfloat16)
