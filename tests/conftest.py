import pytest
import torch


def _cuda_usable():
    try:
        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except RuntimeError:  # e.g. "CUDA driver version is insufficient"
        return False


CUDA = _cuda_usable()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords and not CUDA:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
