"""update_scale_ against torch._amp_update_scale_, and its hysteresis and bounds."""
import pytest
import torch

from fused_amp import ops


def torch_state(init):
    return torch.tensor([init]), torch.zeros(1, dtype=torch.int32)


@pytest.mark.parametrize("growth_factor,backoff_factor,interval", [
    (2.0, 0.5, 2000), (2.0, 0.5, 1), (2.0, 0.5, 3), (1.5, 0.25, 5), (3.0, 0.9, 7)])
def test_matches_torch_over_random_overflow_patterns(growth_factor, backoff_factor, interval):
    gen = torch.Generator().manual_seed(interval)
    for init in (2.0 ** 16, 1.0, 3.0e38, 1e-30):
        ours_scale, ours_tracker = torch_state(init)
        theirs_scale, theirs_tracker = torch_state(init)
        overflow = torch.rand(3000, generator=gen) < 0.05
        for step, inf in enumerate(overflow.tolist()):
            found = torch.tensor([float(inf)])
            ops.update_scale_(ours_scale, ours_tracker, found, growth_factor, backoff_factor, interval)
            torch._amp_update_scale_(theirs_scale, theirs_tracker, found, growth_factor,
                                     backoff_factor, interval)
            assert ours_scale.item() == theirs_scale.item(), f"step {step}"
            assert ours_tracker.item() == theirs_tracker.item(), f"step {step}"


def test_growth_stops_at_a_finite_value():
    scale, tracker = torch_state(3.0e38)
    ops.update_scale_(scale, tracker, torch.zeros(1), 2.0, 0.5, 1)
    assert scale.item() == pytest.approx(3.0e38) and tracker.item() == 0


def run(sequence, **kwargs):
    """Scales after each step of a hand-worked sequence of overflow flags."""
    scale, tracker = torch_state(kwargs.pop("init", 1024.0))
    hysteresis_tracker = torch.zeros(1, dtype=torch.int32)
    out = []
    for inf in sequence:
        ops.update_scale_(scale, tracker, torch.tensor([float(inf)]), 2.0, 0.5,
                          kwargs.get("interval", 3), hysteresis=kwargs.get("hysteresis", 1),
                          hysteresis_tracker=hysteresis_tracker,
                          min_scale=kwargs.get("min_scale"), max_scale=kwargs.get("max_scale"))
        out.append(scale.item())
    return out


def test_hysteresis_backs_off_on_the_nth_overflow_in_a_row():
    # hysteresis 2: first overflow tolerated, second in a row backs off, third too;
    # a clean step resets the count.
    assert run([1, 1, 1, 0, 1, 0, 1, 1], hysteresis=2) == [
        1024, 512, 256, 256, 256, 256, 256, 128]


def test_hysteresis_overflow_still_resets_growth():
    # interval 3: two clean steps, a tolerated overflow restarts the count
    assert run([0, 0, 1, 0, 0, 0], hysteresis=3) == [1024, 1024, 1024, 1024, 1024, 2048]


def test_min_scale_bounds_backoff():
    assert run([1, 1, 1, 1], init=4.0, min_scale=1.0) == [2.0, 1.0, 1.0, 1.0]


def test_max_scale_bounds_growth():
    assert run([0] * 9, init=1024.0, interval=3, max_scale=3000.0) == [
        1024, 1024, 2048, 2048, 2048, 3000, 3000, 3000, 3000]


def test_hysteresis_needs_a_tracker():
    scale, tracker = torch_state(1.0)
    with pytest.raises(ValueError, match="hysteresis_tracker"):
        ops.update_scale_(scale, tracker, torch.zeros(1), 2.0, 0.5, 10, hysteresis=2)


@pytest.mark.cuda
def test_cuda_matches_torch():
    gen = torch.Generator().manual_seed(1)
    scale = torch.full((1,), 2.0 ** 16, device="cuda")
    tracker = torch.zeros(1, dtype=torch.int32, device="cuda")
    theirs, theirs_tracker = scale.clone(), tracker.clone()
    for inf in (torch.rand(500, generator=gen) < 0.1).tolist():
        found = torch.full((1,), float(inf), device="cuda")
        ops.update_scale_(scale, tracker, found, 2.0, 0.5, 3)
        torch._amp_update_scale_(theirs, theirs_tracker, found, 2.0, 0.5, 3)
    assert scale.item() == theirs.item() and tracker.item() == theirs_tracker.item()
