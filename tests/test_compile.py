"""torch.compile(fullgraph=True) traces the ops and gives the eager results."""
import torch

from fused_amp import ops


def amp_step(grads, found_inf, inv_scale, scale, tracker):
    ops.unscale_(grads, found_inf, inv_scale)
    ops.update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2)


def make():
    grads = [torch.randn(300), torch.randn(77).bfloat16()]
    return grads, torch.zeros(1), torch.tensor([0.125]), torch.tensor([8.0]), torch.zeros(1, dtype=torch.int32)


def test_compile_fullgraph_matches_eager():
    eager = make()
    compiled = [x.clone() if isinstance(x, torch.Tensor) else [t.clone() for t in x] for x in eager]
    step = torch.compile(amp_step, fullgraph=True, backend="inductor")
    for i in range(3):
        if i == 2:
            eager[0][1][5] = float("inf")
            compiled[0][1][5] = float("inf")
        amp_step(*eager)
        step(*compiled)
        for a, b in zip(eager[0], compiled[0]):
            assert torch.equal(a, b)
        for a, b in zip(eager[1:], compiled[1:]):
            assert torch.equal(a, b)
    assert eager[3].item() == 8.0  # 8 grew to 16 at step 2 (interval 2), backed off at step 3
