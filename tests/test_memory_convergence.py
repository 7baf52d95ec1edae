"""The memory modes against fp32 masters on real text (fused_amp/benchmark/convergence.py)."""
import math

from fused_amp.benchmark import convergence


def test_memory_modes_train_as_fp32_masters_do_on_real_text():
    """A char-level LM on Python's documentation, bf16 weights, 3 seeds: remainder mode ends
    within the seeds' spread of fp32 masters (only ties round differently), bf16 state within
    0.5% of their final loss; plain bf16 is reported beside (fused_amp/benchmark/suites/memory.py has
    the longer runs and the outside references)."""
    modes = ["fp32 masters", "remainder", "bf16 state", "bf16 state, stochastic", "plain bf16 (no masters)"]
    res = convergence.compare(modes, seeds=[0, 1, 2], steps=250)
    fp32 = res["fp32 masters"]
    for mode in ("remainder", "bf16 state, stochastic"):
        assert abs(res[mode]["mean"] - fp32["mean"]) <= max(fp32["spread"], res[mode]["spread"]), (mode, res)
    for mode in ("bf16 state", "bf16 state, stochastic"):
        assert abs(res[mode]["mean"] / fp32["mean"] - 1) <= 0.005, (mode, res)
    for r in res.values():
        assert math.isfinite(r["mean"]) and r["mean"] < math.log(convergence.VOCAB)  # they learn
