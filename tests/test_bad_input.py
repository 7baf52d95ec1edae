"""Bad input is refused with a clear exception before any tensor changes."""
import pytest
import torch

from fused_amp import ops


def good():
    return [torch.randn(100), torch.randn(50).bfloat16()]


def check_refused(exc, match, tensors, found, inv):
    before = [t.clone() for t in tensors if t.layout == torch.strided]
    found_before = found.clone()
    with pytest.raises(exc, match=match):
        ops.unscale_(tensors, found, inv)
    after = [t for t in tensors if t.layout == torch.strided]
    for a, b in zip(after, before):
        assert torch.equal(a, b)
    if found.layout == torch.strided and found.numel():
        assert torch.equal(found, found_before)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.uint8, torch.complex64])
def test_unsupported_dtype(dtype):
    tensors = good() + [torch.zeros(4, dtype=dtype)]
    tensors[0][0] = float("inf")
    check_refused(TypeError, r"unscale_: tensors\[2\] has dtype", tensors, torch.zeros(1),
                  torch.tensor([0.5]))


def test_mixed_devices():
    tensors = good() + [torch.zeros(4, device="meta")]
    with pytest.raises(ValueError, match=r"tensors\[2\] is on meta"):
        ops.unscale_(tensors, torch.zeros(1), torch.tensor([0.5]))


def test_sparse():
    tensors = good() + [torch.randn(4, 4).to_sparse()]
    check_refused(ValueError, r"unscale_: tensors\[2\] is sparse", tensors, torch.zeros(1),
                  torch.tensor([0.5]))


def test_overlapping_tensor_refused():
    """An expanded tensor cannot be unscaled in place (torch refuses it too)."""
    tensors = good() + [torch.randn(1).expand(8)]
    check_refused(ValueError, r"tensors\[2\] has elements that share memory", tensors,
                  torch.zeros(1), torch.tensor([0.5]))


@pytest.mark.parametrize("found,match", [
    (torch.zeros(2), "found_inf must have exactly one element"),
    (torch.zeros(1, dtype=torch.float64), "found_inf must be Float"),
    (torch.zeros(1, dtype=torch.int32), "found_inf must be Float"),
])
def test_bad_found_inf(found, match):
    check_refused((ValueError, TypeError), match, good(), found, torch.tensor([0.5]))


@pytest.mark.parametrize("inv,match", [
    (torch.tensor([0.5, 0.5]), "inv_scale must have exactly one element"),
    (torch.tensor([0.5], dtype=torch.float64), "inv_scale must be Float"),
    (torch.tensor([0.5], dtype=torch.float16), "inv_scale must be Float"),
])
def test_bad_inv_scale(inv, match):
    check_refused((ValueError, TypeError), match, good(), torch.zeros(1), inv)


def test_found_inf_on_another_device():
    with pytest.raises(ValueError, match="is on"):
        ops.unscale_(good(), torch.zeros(1, device="meta"), torch.tensor([0.5]))


def test_update_scale_bad_arguments():
    scale, tracker, found = torch.ones(1), torch.zeros(1, dtype=torch.int32), torch.zeros(1)
    with pytest.raises(TypeError, match="growth_tracker must be Int"):
        ops.update_scale_(scale, torch.zeros(1), found, 2.0, 0.5, 10)
    with pytest.raises(ValueError, match="growth_interval must fit in int32"):
        ops.update_scale_(scale, tracker, found, 2.0, 0.5, 2 ** 31)
    with pytest.raises(ValueError, match="min_scale"):
        ops.update_scale_(scale, tracker, found, 2.0, 0.5, 10, min_scale=4.0, max_scale=2.0)
    assert scale.item() == 1.0 and tracker.item() == 0
