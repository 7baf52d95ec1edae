"""Proof that the emulator's tests bite: mutants of the real device code, each of which must fail
a test of tests/test_cuda_sim.py (run on the emulator, tests/cuda_sim/emulator/).

The mutants, found in csrc/cuda/ by pattern, so that a new barrier or shuffle gets its own:
- each __syncthreads() removed in turn;
- each warp shuffle made to return the calling lane's own value;
- the 8-bit tiles' shared absmax without its tile parity (one buffer for every tile);
- an off-by-one in a chunk's tail (one element short), in the elementwise launches and in the
  reductions; one thread too many in a level of the reduction tree;
- the tiles' barrier skipped by the threads whose elements lie past the chunk's end;
- MX copies: a block's shuffle over the whole warp, step chunks that cut blocks, the strided
  path's scales written to the wrong block.
All of them are compiled into one scratch copy of csrc/ (each behind `FA_MUTANT(id)`, switched on
by FUSED_AMP_MUTANT=id), which the tests build once (FUSED_AMP_EMULATION_CSRC); a mutant of a
constant switches too: that copy declares the constant `inline const`, initialized at load time
(the emulation uses it at run time only; a use that needs a constant fails the copy's build).
The quick tier of the tests (make test's) runs for each mutant until the first failure; then the
tests that failed run with every switch off, and must pass: each failure was its mutant's. The
table names the test that failed and what caught it: a check of the emulator (race, barrier,
warp, init, bounds, misaligned) or a value that differs from the CPU ops or torch. Exit status 1
when a mutant survives.

    .venv/bin/python tools/mutate_device_code.py [--jobs 2] [--only SUBSTRING] [--record]

With FUSED_AMP_CI_SELECT=changed (CI, make ci-local) it runs the mutants tools/ci_select.py
picks (changed files, files including a changed header, changed killers, a third of the rest);
--record writes each mutant's killing test to .ci/mutant-killers.txt.
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA = os.path.join(ROOT, "csrc", "cuda")
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ci_select  # noqa: E402
from cuda_sim.build import compile_libraries, library_folder  # noqa: E402

# Mutants at fixed places: (file, its text with the mutated part written {original|mutant}, what
# it does). A part that is a statement (ends with ";", or is empty) is switched by an if, any
# other by a conditional expression.
FIXED = [
    ("step_states.cuh", "parity ^= {1|0}", "8-bit tiles' absmax without its tile parity"),
    ("multi_tensor_apply.cuh", "return f.partial(meta, t, start, left < kChunkSize ? {left|left - 1} : kChunkSize);",
     "reduction's chunk tail one short"),
    ("multi_tensor_apply.cuh", "f(meta, t, start, left < Shape::kChunk ? {left|left - 1} : Shape::kChunk);",
     "elementwise chunk tail one short"),
    ("multi_tensor_apply.cuh", "if ({threadIdx.x < s|threadIdx.x <= s}) v[threadIdx.x]",
     "reduction tree with one thread too many per level"),
    # (the threads past the end leave before the barrier, the others wait there)
    ("step_states.cuh", "      {|if (ix.base >= n) continue;}__syncthreads();\n      if (ix.base >= n) continue;\n",
     "tile barrier skipped by the threads past the chunk's end"),
    ("epilogues.cuh", "{((1u << kBlockLanes) - 1u) << (lane / kBlockLanes * kBlockLanes)|0xffffffffu}",
     "MX block's shuffle over the whole warp, not the block's lanes"),
    ("epilogues.cuh", "if (lane == 0) scales[{i|ix.base} / ops::kMxBlock]",
     "MX scales of the strided path's later elements written to its first element's block"),
]
# Mutants of constants: in the mutants' copy the declaration's `constexpr` becomes `inline const`.
CONSTANT = [
    ("step.cuh", "static constexpr int64_t kChunk = {ElementwiseShape::kChunk / ops::kMxBlock * ops::kMxBlock|"
                 "ElementwiseShape::kChunk}",
     "step chunks that cut MX blocks"),
]
SWITCH = """// the mutant that is on (FUSED_AMP_MUTANT; -1: none): tools/mutate_device_code.py
#pragma once
#include <cstdlib>
inline const int fa_device_mutant = std::getenv("FUSED_AMP_MUTANT") ? std::atoi(std::getenv("FUSED_AMP_MUTANT")) : -1;
#define FA_MUTANT(id) (::fa_device_mutant == (id))
"""


def sources():
    """The device code: every .cu and .cuh but compat.cuh, which maps CUDA's names for the emulator."""
    for name in sorted(os.listdir(CUDA)):
        if name.endswith((".cu", ".cuh")) and name != "compat.cuh":
            yield name, open(os.path.join(CUDA, name)).read()


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def fixed_site(text, file, spec, what):
    """(start, end, original, mutant) of a FIXED or CONSTANT spec in text."""
    m = re.fullmatch(r"(.*)\{(.*?)\|(.*?)\}(.*)", spec, re.S)
    before, old, new, after = m.groups()
    assert text.count(before + old + after) == 1, f"{file}: the text of mutant '{what}' is not there once"
    start = text.index(before + old + after) + len(before)
    return start, start + len(old), old, new


def key(name, file, start, texts):
    """What names a mutant while the lines around it move (CI's rotation and killer record)."""
    text = texts[file]
    line = text[text.rfind("\n", 0, start) + 1:text.find("\n", start)].strip()
    return f"cuda/{file}|{name.rsplit(' (', 1)[0]}|{line}"


def mutants():
    """(name, file, start, end, original, mutant, constant) of every mutant, by file and place."""
    found, texts = [], dict(sources())
    for name, text in texts.items():
        for m in re.finditer(r"__syncthreads\(\);", text):
            found.append(("barrier removed", name, m.start(), m.end(), m.group(0), "", False))
        for m in re.finditer(r"__shfl(?:_\w+)?_sync\(([^,]+),\s*([^,]+),[^)]*\)", text):
            found.append(("shuffle returns the lane's own value", name, m.start(), m.end(), m.group(0), m.group(2),
                          False))
        for specs, constant in ((FIXED, False), (CONSTANT, True)):
            for file, spec, what in specs:
                if file == name:
                    found.append((what, name, *fixed_site(text, name, spec, what), constant))
    return [(f"{what} ({file}:{line_of(texts[file], start)})", file, start, end, old, new, constant)
            for what, file, start, end, old, new, constant in sorted(found, key=lambda m: (m[1], m[2]))]


def switched(mutant_id, old, new):
    """The text that is `new` while mutant_id is on and `old` otherwise."""
    if old.endswith(";") or new.endswith(";") or not old or not new:
        return f"if (FA_MUTANT({mutant_id})) {{ {new} }} else {{ {old} }}"
    return f"(FA_MUTANT({mutant_id}) ? ({new}) : ({old}))"


def scratch_copy(folder, edits):
    """csrc/ copied under folder, with edits {file: [(start, end, text)]} made; its path."""
    csrc = os.path.join(folder, "csrc")
    shutil.copytree(os.path.join(ROOT, "csrc"), csrc)
    for file, spans in edits.items():
        text = open(os.path.join(CUDA, file)).read()
        for start, end, new in sorted(spans, reverse=True):
            assert all(end <= s or e <= start for s, e, _ in spans if (s, e) != (start, end)), \
                f"{file}: two mutants overlap"
            text = text[:start] + new + text[end:]
        with open(os.path.join(csrc, "cuda", file), "w") as f:
            f.write(('#include "mutant_switch.h"\n' if "FA_MUTANT(" in text else "") + text)
    with open(os.path.join(csrc, "mutant_switch.h"), "w") as f:
        f.write(SWITCH)
    return csrc


CHECKS = ("race", "barrier", "warp", "init", "bounds", "misaligned")


TESTS = "tests/test_cuda_sim.py"


def pytest(csrc, mutant_id, python, tmp, args):
    """The output of pytest with args on the emulation of csrc, mutant_id on (-1: none)."""
    env = dict(os.environ, FUSED_AMP_EMULATION_CSRC=csrc, FUSED_AMP_TEST_TIER="quick",
               FUSED_AMP_MUTANT=str(mutant_id))
    with tempfile.TemporaryDirectory(prefix="pytest_", dir=tmp) as basetemp:
        return subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", "--basetemp", basetemp,
                               *args], cwd=ROOT, env=env, capture_output=True, text=True).stdout


def run(csrc, mutant_id, python, tmp):
    """(the first failed test or None, what caught it, seconds) of the quick tier (make test's)
    of TESTS on the emulation of csrc with mutant_id on, to its first failure."""
    t0 = time.time()
    out = pytest(csrc, mutant_id, python, tmp, ["-x", TESTS])
    failed = re.search(r"^FAILED \S+?::(.+?)(?: - |$)", out, re.M)
    if not failed:
        return None, "SURVIVED", time.time() - t0
    error = re.search(r"^E\s+(.*)$", out, re.M)
    first = error.group(1) if error else ""
    found = re.search(r"EmulatorError: (\w+)", first)
    if found and found.group(1) in CHECKS:
        caught = f"{found.group(1)} check"
    elif "compil" in out or "CalledProcessError" in out:
        caught = "build failed"  # not a proof: the mutant must compile
    else:
        caught = "value"
    return failed.group(1), caught, time.time() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", default="", help="run the mutants whose name has this text")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--record", action="store_true", help="record each mutant's killer (.ci/mutant-killers.txt)")
    args = parser.parse_args()
    every, texts = mutants(), dict(sources())
    keys = {m[0]: key(m[0], m[1], m[2], texts) for m in every}
    selection = ci_select.MutantSelection(ci_select.killers_recorded("device"))
    why = {m[0]: selection.why("cuda/" + m[1], keys[m[0]]) for m in every}
    chosen = [m for m in every if args.only in m[0] and why[m[0]]]
    if args.record and len(chosen) < len(every):
        raise SystemExit("--record needs every mutant: run it without FUSED_AMP_CI_SELECT=changed or --only")
    print(f"{len(chosen)} mutants of csrc/cuda, tests/test_cuda_sim.py on the emulator, {args.jobs} at a time\n")
    if not chosen:
        print(f"device mutants: {len(every)}, 0 ran, 0 killed")
        return 0
    with tempfile.TemporaryDirectory(prefix="fused_amp_mutants_") as tmp:
        # one copy with every switch (a constant's declaration loses its constexpr)
        edits = {}
        for i, (name, file, start, end, old, new, constant) in enumerate(chosen):
            edits.setdefault(file, []).append((start, end, switched(i, old, new)))
            if constant:
                declared = texts[file].rfind("constexpr", 0, start)
                edits[file].append((declared, declared + len("constexpr"), "inline const"))
        switches = scratch_copy(os.path.join(tmp, "switches"), edits)
        # the plan builds first (its tests come first; the real sizes' build, if a run needs it)
        t0 = time.time()
        compile_libraries(["plan"], switches, library_folder(switches))
        print(f"the emulation with every mutant: {time.time() - t0:.0f} s\n")
        print("| mutant | why it ran | failed test | caught by | s |\n|---|---|---|---|---|", flush=True)
        survived, failed, killers = 0, set(), {}
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for (name, *_), (test, caught, seconds) in zip(
                    chosen, pool.map(lambda i: run(switches, i, args.python, tmp), range(len(chosen)))):
                print(f"| {name} | {why[name]} | {test or '-'} | {caught} | {seconds:.0f} |", flush=True)
                survived += caught in ("SURVIVED", "build failed")
                killers[keys[name]] = f"{TESTS}::{test}" if test else None
                if test:
                    failed.add(test)
        print(f"\ndevice mutants: {len(every)}, {len(chosen)} ran "
              f"({', '.join(f'{n} {w}' for w, n in Counter(why[m[0]] for m in chosen).most_common())}), "
              f"{len(chosen) - survived} killed")
        # with every switch off, the tests that failed pass: each failure was its mutant's
        out = pytest(switches, -1, args.python, tmp, [f"{TESTS}::{t}" for t in sorted(failed)]) if failed else ""
        if failed and not re.search(rf"^{len(failed)} passed", out, re.M):
            print(out[-3000:] + "\nwith every switch off, the tests above do not all pass: the failures prove nothing")
            return 1
        print(f"with every switch off, the tests that failed pass ({len(failed)} of them)")
    if args.record:
        ci_select.record_killers("device", killers)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
