"""pytest plugin of tools/mutate_cpu_code.py: runs the collected tests once per mutant of the CPU
code in one process, each mutant until its first failing test.

The extension under test is the mutant build (every mutant compiled in, each behind
`fused_amp_mutant == id`), so a mutant is switched on by setting that global, here through
ctypes, and in processes the tests start through FUSED_AMP_MUTANT. Per mutant, the tests that
killed a mutant of the same file run first, then those whose id names its optimizer or storage
kind, then the rest (each group fastest first); a test that kills a mutant must pass without
one. One JSON line per event goes to
--mutant-progress, so that the driver can resume after a mutant that crashed or hung the process.
"""
import ctypes
import json
import os
import re
import time

import pytest
from _pytest.runner import runtestprotocol


def pytest_addoption(parser):
    parser.addoption("--mutants", help="JSON file: the mutants to run, [{id, name, keywords}]")
    parser.addoption("--mutant-progress", help="file the results are appended to, a JSON line each")


def _switch():
    import fused_amp._C as ext
    return ctypes.c_int.in_dll(ctypes.CDLL(ext.__file__), "fused_amp_mutant")


def _run(session, items, mutant_id, switch):
    """Runs items with the mutant on until one fails: (the failing item's id or None, seconds per item)."""
    switch.value = mutant_id
    os.environ["FUSED_AMP_MUTANT"] = str(mutant_id)
    seconds, failed = {}, None
    try:
        for i, item in enumerate(items):
            t0 = time.perf_counter()
            reports = runtestprotocol(item, nextitem=items[i + 1] if i + 1 < len(items) else None, log=False)
            seconds[item.nodeid] = time.perf_counter() - t0
            if any(r.failed for r in reports):
                failed = item.nodeid
                break
    finally:
        session._setupstate.teardown_exact(None)  # each mutant starts from fresh fixtures
        switch.value = -1
        os.environ["FUSED_AMP_MUTANT"] = "-1"
    return failed, seconds


def _order(items, mutant, killers, seconds):
    """The order to run items in for a mutant: the tests that killed a mutant of its file before,
    then those whose id names one of its keywords (the first keyword's first), then the other
    killers, then the rest; within each, the fastest seen first."""
    patterns = [re.compile(k, re.I) for k in mutant["keywords"]]
    mine = killers.get(mutant["file"], set())
    every = set().union(*killers.values()) if killers else set()

    def rank(i_item):
        i, item = i_item
        named = next((k for k, p in enumerate(patterns) if p.search(item.nodeid)), None)
        group = (0, 0) if item.nodeid in mine else (1, named) if named is not None else \
            (2, 0) if item.nodeid in every else (3, 0)
        return group, seconds.get(item.nodeid, 1e9), i
    return [item for _, item in sorted(enumerate(items), key=rank)]


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    config = session.config
    if not config.getoption("--mutants") or session.testsfailed or config.option.collectonly:
        return None
    mutants = json.load(open(config.getoption("--mutants")))
    progress = open(config.getoption("--mutant-progress"), "a", buffering=1)
    switch = _switch()
    by_id = {item.nodeid: item for item in session.items}
    killers, seconds, passes = {}, {}, set()  # passes: the killers seen passing without a mutant
    for m in mutants:
        progress.write(json.dumps({"start": m["id"]}) + "\n")
        t0 = time.perf_counter()
        killer, took = _run(session, _order(session.items, m, killers, seconds), m["id"], switch)
        seconds.update(took)
        # a kill counts only if that test passes without a mutant (checked once per test)
        if killer and killer not in passes:
            failed, _ = _run(session, [by_id[killer]], -1, switch)
            if failed:
                raise session.Failed(f"{killer} fails without a mutant: no mutant it fails can be judged")
            passes.add(killer)
        if killer:
            killers.setdefault(m["file"], set()).add(killer)
        progress.write(json.dumps({"id": m["id"], "killed_by": killer, "seconds": time.perf_counter() - t0}) + "\n")
    return True
