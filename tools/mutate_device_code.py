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
Each mutant is a scratch copy of csrc/ built by the tests (FUSED_AMP_EMULATION_CSRC), whose quick
tier (make test's) runs until the first failure. The table names the test that failed and what caught it: a check of the
emulator (race, barrier, warp, init, bounds, misaligned) or a value that differs from the CPU ops
or torch. Exit status 1 when a mutant survives.

    .venv/bin/python tools/mutate_device_code.py [--jobs 2] [--only SUBSTRING]
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA = os.path.join(ROOT, "csrc", "cuda")


def sources():
    """The device code: every .cu and .cuh but compat.cuh, which maps CUDA's names for the emulator."""
    for name in sorted(os.listdir(CUDA)):
        if name.endswith((".cu", ".cuh")) and name != "compat.cuh":
            yield name, open(os.path.join(CUDA, name)).read()


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def mutants():
    """(name, file, mutated text) for every mutant."""
    texts = dict(sources())
    for name, text in texts.items():
        for m in re.finditer(r"__syncthreads\(\);", text):
            yield (f"barrier removed ({name}:{line_of(text, m.start())})", name,
                   text[:m.start()] + ";" + text[m.end():])
        for m in re.finditer(r"__shfl(?:_\w+)?_sync\(([^,]+),\s*([^,]+),[^)]*\)", text):
            yield (f"shuffle returns the lane's own value ({name}:{line_of(text, m.start())})", name,
                   text[:m.start()] + m.group(2) + text[m.end():])
    fixed = {  # (file, exact text, replacement, name)
        ("step_states.cuh", "parity ^= 1", "parity ^= 0", "8-bit tiles' absmax without its tile parity"),
        ("multi_tensor_apply.cuh", "return f.partial(meta, t, start, left < kChunkSize ? left : kChunkSize);",
         "return f.partial(meta, t, start, left < kChunkSize ? left - 1 : kChunkSize);",
         "reduction's chunk tail one short"),
        ("multi_tensor_apply.cuh", "f(meta, t, start, left < Shape::kChunk ? left : Shape::kChunk);",
         "f(meta, t, start, left < Shape::kChunk ? left - 1 : Shape::kChunk);",
         "elementwise chunk tail one short"),
        ("multi_tensor_apply.cuh", "if (threadIdx.x < s) v[threadIdx.x]", "if (threadIdx.x <= s) v[threadIdx.x]",
         "reduction tree with one thread too many per level"),
        ("step_states.cuh", "      __syncthreads();\n      if (ix.base >= n) continue;\n",
         "      if (ix.base >= n) continue;\n      __syncthreads();\n",
         "tile barrier skipped by the threads past the chunk's end"),
        ("step.cuh", "((1u << kBlockLanes) - 1u) << (lane / kBlockLanes * kBlockLanes)", "0xffffffffu",
         "MX block's shuffle over the whole warp, not the block's lanes"),
        ("step.cuh", "ElementwiseShape::kChunk / ops::kMxBlock * ops::kMxBlock", "ElementwiseShape::kChunk",
         "step chunks that cut MX blocks"),
        ("step.cuh", "if (lane == 0) scales[i / ops::kMxBlock]", "if (lane == 0) scales[ix.base / ops::kMxBlock]",
         "MX scales of the strided path's later elements written to its first element's block"),
    }
    for name, old, new, what in sorted(fixed):
        assert texts[name].count(old) == 1, f"{name}: the text of mutant '{what}' is not there once"
        yield f"{what} ({name}:{line_of(texts[name], texts[name].index(old))})", name, texts[name].replace(old, new)


CHECKS = ("race", "barrier", "warp", "init", "bounds", "misaligned")


def run(mutant, python):
    name, file, text = mutant
    with tempfile.TemporaryDirectory(prefix="fused_amp_mutant_") as tmp:
        csrc = os.path.join(tmp, "csrc")
        shutil.copytree(os.path.join(ROOT, "csrc"), csrc)
        with open(os.path.join(csrc, "cuda", file), "w") as f:
            f.write(text)
        # the quick tier (make test) must kill each one
        env = dict(os.environ, FUSED_AMP_EMULATION_CSRC=csrc, FUSED_AMP_TEST_TIER="quick")
        t0 = time.time()
        out = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rf",
                              "tests/test_cuda_sim.py", "--basetemp", os.path.join(tmp, "pytest")],
                             cwd=ROOT, env=env, capture_output=True, text=True).stdout
    failed = re.search(r"^FAILED (\S+)", out, re.M)
    if not failed:
        return name, None, "SURVIVED", time.time() - t0
    error = re.search(r"^E\s+(.*)$", out, re.M)
    first = error.group(1) if error else ""
    found = re.search(r"EmulatorError: (\w+)", first)
    if found and found.group(1) in CHECKS:
        caught = f"{found.group(1)} check"
    elif "compil" in out or "CalledProcessError" in out:
        caught = "build failed"  # not a proof: the mutant must compile
    else:
        caught = "value"
    return name, failed.group(1).split("::", 1)[1], caught, time.time() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", default="", help="run the mutants whose name has this text")
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    chosen = [m for m in mutants() if args.only in m[0]]
    print(f"{len(chosen)} mutants of csrc/cuda, tests/test_cuda_sim.py on the emulator, {args.jobs} at a time\n")
    print("| mutant | failed test | caught by | s |\n|---|---|---|---|", flush=True)
    survived = 0
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for name, test, caught, seconds in pool.map(lambda m: run(m, args.python), chosen):
            print(f"| {name} | {test or '-'} | {caught} | {seconds:.0f} |", flush=True)
            survived += caught in ("SURVIVED", "build failed")
    print(f"\n{len(chosen) - survived} of {len(chosen)} mutants caught")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
