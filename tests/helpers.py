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


# ---- the random bits of stochastic rounding, written again from csrc/ops/rounding.h ----------

_M32 = 0xffffffff


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c modulo 2^32 for 32-bit x in int64, without overflowing 64 bits."""
    return (x * (c & 0xffff) + (((x * (c >> 16)) & 0xffff) << 16)) & _M32


def mix32(x):
    """lowbias32 on int64 tensors (or a Python int) holding 32-bit values."""
    t = torch.as_tensor(x, dtype=torch.int64) & _M32
    t = t ^ (t >> 16)
    t = _mul32(t, 0x7feb352d)
    t = t ^ (t >> 15)
    t = _mul32(t, 0x846ca68b)
    return t ^ (t >> 16)


def rounding_key(seed: int, step: int) -> int:
    """The key of one optimizer step: its seed and 1-based step count."""
    s = seed % 2**64
    return int(mix32((s & _M32) ^ int(mix32((s >> 32) ^ int(mix32(step))))))


def rounding_bits(key: int, n: int) -> torch.Tensor:
    """The 32 random bits of elements 0..n-1 (int64)."""
    return mix32(torch.arange(n, dtype=torch.int64) ^ key)


# ---- the step op in the argument shape of Adam's and SGD's own lists --------------------------
def adam_step_(params, grads, master_params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, beta1, beta2,
               eps, weight_decay, amsgrad, maximize, decoupled_weight_decay, **kwargs):
    """fused_amp.ops.step_("adam", ...) with Adam's state lists and hyperparameters as arguments."""
    from fused_amp import ops
    states = [exp_avgs, exp_avg_sqs] + ([max_exp_avg_sqs] if amsgrad or max_exp_avg_sqs else [])
    ops.step_("adam", params, grads, master_params, states, steps,
              hyper=dict(beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, decoupled_weight_decay=decoupled_weight_decay), **kwargs)


def sgd_step_(params, grads, master_params, momentum_buffers, steps, *, momentum, dampening, weight_decay,
              nesterov, maximize, **kwargs):
    """fused_amp.ops.step_("sgd", ...) with SGD's buffer list and hyperparameters as arguments."""
    from fused_amp import ops
    states = [momentum_buffers] if momentum != 0 or momentum_buffers else []
    ops.step_("sgd", params, grads, master_params, states, steps,
              hyper=dict(momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                         maximize=maximize), **kwargs)


def lion_step_(params, grads, master_params, exp_avgs, steps, *, beta1, beta2, weight_decay, maximize, **kwargs):
    """fused_amp.ops.step_("lion", ...) with Lion's state list and hyperparameters as arguments."""
    from fused_amp import ops
    ops.step_("lion", params, grads, master_params, [exp_avgs], steps,
              hyper=dict(beta1=beta1, beta2=beta2, weight_decay=weight_decay, maximize=maximize), **kwargs)


def assert_our_keywords(ours, theirs):
    """An optimizer's signature (``inspect.signature(...).parameters``) beside torch's: torch's
    arguments, then keyword-only the options of fused_amp.optim._options.FUSED_AMP_OPTIONS, with
    that table's defaults (the one place they are declared)."""
    import inspect

    from fused_amp.optim._options import FUSED_AMP_OPTIONS
    for name, param in theirs.items():
        assert name in ours, name
        assert ours[name].kind == param.kind, name
        if param.default is not inspect.Parameter.empty:
            assert ours[name].default == param.default, name
    extra = set(ours) - set(theirs)
    assert extra == set(FUSED_AMP_OPTIONS)
    for name in extra:
        assert ours[name].kind == inspect.Parameter.KEYWORD_ONLY, name
        assert ours[name].default == FUSED_AMP_OPTIONS[name][0], name
