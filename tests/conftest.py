import os
from collections import defaultdict

import pytest
import torch

# make test runs the quick tier; make test-rest the rest of the matrix, make test-soak the soaks;
# make test-full all three, as a plain pytest does (docs/development.md)
TIER = os.environ.get("FUSED_AMP_TEST_TIER", "full")
if TIER not in ("quick", "rest", "soak", "full"):
    raise ValueError(f"FUSED_AMP_TEST_TIER must be quick, rest, soak or full, got {TIER!r}")


def _cuda_usable():
    try:
        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except RuntimeError:  # e.g. "CUDA driver version is insufficient"
        return False


CUDA = _cuda_usable()


def _values(item):
    """(which parametrize, the id of its value) for each parametrize of a parametrized item."""
    return set(enumerate(item.callspec._idlist))


def each_value_once(items):
    """Of one test function's parametrized items, a few in which every value of every one of
    its parameters appears at least once (each optimizer's every option set, each dtype, each
    memory mode, ...), chosen greedily in collection order: the quick tier's rule."""
    needed = {pair for item in items for pair in _values(item)}
    chosen, left = [], list(items)
    while needed:
        best = max(left, key=lambda item: len(needed.intersection(_values(item))))
        chosen.append(best)
        left.remove(best)
        needed.difference_update(_values(best))
    return chosen


def _tier(config, items, tier):
    """quick: every test function runs; a parametrized one on ``each_value_once`` of its items.
    rest: the items quick leaves out. soak: the tests marked ``soak`` (soaks and benchmark
    harnesses' runs of minutes), which neither of the others runs."""
    soak = {id(item) for item in items if "soak" in item.keywords}
    by_function = defaultdict(list)
    for item in items:
        if hasattr(item, "callspec") and id(item) not in soak:
            by_function[(item.path, item.originalname)].append(item)
    keep = {id(item) for group in by_function.values() for item in each_value_once(group)}
    tier_of = {id(item): "soak" if id(item) in soak else
               "quick" if not hasattr(item, "callspec") or id(item) in keep else "rest" for item in items}
    config.hook.pytest_deselected(items=[item for item in items if tier_of[id(item)] != tier])
    items[:] = [item for item in items if tier_of[id(item)] == tier]


def pytest_collection_modifyitems(config, items):
    if TIER != "full":
        _tier(config, items, TIER)
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords and not CUDA:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
