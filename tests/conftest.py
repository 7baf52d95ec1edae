import os
import zlib
from collections import defaultdict

import pytest
import torch

# make test runs the quick tier, make test-pairs the pairs tier (CI runs both); make
# test-exhaustive every tier, as a plain pytest does (docs/development.md)
TIER = os.environ.get("FUSED_AMP_TEST_TIER", "full")
if TIER not in ("quick", "pairs", "rest", "soak", "full"):
    raise ValueError(f"FUSED_AMP_TEST_TIER must be quick, pairs, rest, soak or full, got {TIER!r}")


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


def _pairs(item):
    """The pairs of (parametrize, value) that a parametrized item runs together."""
    values = sorted(_values(item))
    return {(a, b) for i, a in enumerate(values) for b in values[i + 1:]}


def each_pair_once(items):
    """``each_value_once`` of the items, then more, greedily, until every pair of values of any
    two of its parameters that some item runs together appears in one of them (each optimizer's
    option sets with each dtype and each memory mode, ...): the quick and pairs tiers' rule."""
    chosen = each_value_once(items)
    needed = set().union(*(_pairs(item) for item in items)) - set().union(*(_pairs(item) for item in chosen))
    left = [item for item in items if item not in chosen]
    while needed:
        best = max(left, key=lambda item: len(needed & _pairs(item)))
        chosen.append(best)
        left.remove(best)
        needed -= _pairs(best)
    return chosen


def _tier(config, items, tier):
    """quick: every test function runs; a parametrized one on ``each_value_once`` of its items.
    pairs: the items ``each_pair_once`` adds to those. rest: the items neither takes (CI runs
    quick and pairs; make test-exhaustive all). soak: the tests marked ``soak`` (soaks and
    benchmark harnesses' runs of minutes), which none of the others runs."""
    soak = {id(item) for item in items if "soak" in item.keywords}
    by_function = defaultdict(list)
    for item in items:
        if hasattr(item, "callspec") and id(item) not in soak:
            by_function[(item.path, item.originalname)].append(item)
    quick, pairs = set(), set()
    for group in by_function.values():
        quick |= {id(item) for item in each_value_once(group)}
        if tier in ("pairs", "rest"):
            pairs |= {id(item) for item in each_pair_once(group)} - quick
    tier_of = {id(item): "soak" if id(item) in soak else
               "quick" if not hasattr(item, "callspec") or id(item) in quick else
               "pairs" if id(item) in pairs else "rest" for item in items}
    config.hook.pytest_deselected(items=[item for item in items if tier_of[id(item)] != tier])
    items[:] = [item for item in items if tier_of[id(item)] == tier]


# FUSED_AMP_TEST_SHARE="k/n": of the tests, those whose id falls in share k of n (a stable hash
# of the id), but every test of the files in FUSED_AMP_TEST_WHOLE: the sanitizers' rotation in CI
# (tools/ci_select.py), which any n consecutive runs cover whole.
SHARE = os.environ.get("FUSED_AMP_TEST_SHARE", "")
WHOLE = set(os.environ.get("FUSED_AMP_TEST_WHOLE", "").split())


def _share(config, items):
    k, n = (int(x) for x in SHARE.split("/"))
    keep = [item for item in items if zlib.crc32(item.nodeid.encode()) % n == k
            or any(item.nodeid.split("::")[0].endswith(w) for w in WHOLE)]
    kept = {id(item) for item in keep}
    config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
    items[:] = keep


def pytest_collection_modifyitems(config, items):
    if TIER != "full":
        _tier(config, items, TIER)
    if SHARE:
        _share(config, items)
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords and not CUDA:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
