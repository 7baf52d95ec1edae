"""Line coverage of the CUDA sources (csrc/cuda/*.cu, *.cuh) and of the emulator
(tests/cuda_sim/emulator/) over the emulator's tests: the builds of tests/cuda_sim/build.py with gcov
instrumentation (-O0), the quick tier of tests/test_cuda_sim.py and tests/test_cuda_emulator.py run against them,
and for each file the lines executed out of those compiled, then every line no test executed,
with the reason where it is known (REASONS).

    .venv/bin/python tools/emulation_coverage.py [--keep DIR]
"""
import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA = os.path.join(ROOT, "csrc", "cuda")
TESTS = ["tests/test_cuda_sim.py", "tests/test_cuda_emulator.py"]
# Lines the tests cannot reach, by a text they hold: why.
REASONS = {
    "set_kernel_arg_bytes": "the GPU tests' switch between the argument plans; the emulation takes the plan from the test",
    "if (bytes != 0": "the GPU tests' switch between the argument plans (set_kernel_arg_bytes)",
    "throw std::invalid_argument(\"kernel argument bytes": "the GPU tests' switch between the argument plans (set_kernel_arg_bytes)",
    "forced_kernel_arg_bytes = bytes": "the GPU tests' switch between the argument plans (set_kernel_arg_bytes)",
    "emulator: no thread can run": "defensive: a stall with no thread in an exchange is a barrier, handled before",
    "default: return \"runs\"": "defensive: a stall report names only waiting or exited threads",
    "__builtin_unreachable": "after setcontext, which does not return",
    "return \"?\"": "a code address outside any loaded object, or addr2line missing",
}


def gcov_lines(data_dir):
    """{file: {line: count}} over every build's line counts (the largest count of a line)."""
    counts = collections.defaultdict(dict)
    for gcda in glob.glob(os.path.join(data_dir, "*.gcda")):
        out = subprocess.run(["gcov", "--json-format", "--stdout", gcda], cwd=data_dir, capture_output=True,
                             text=True, check=True).stdout
        for doc in out.splitlines():
            for f in json.loads(doc)["files"]:
                path = os.path.realpath(f["file"] if os.path.isabs(f["file"]) else os.path.join(data_dir, f["file"]))
                for line in f["lines"]:
                    n = line["line_number"]
                    counts[path][n] = max(counts[path].get(n, 0), line["count"])
    return counts


def reason(text, before, counts, n):
    """Why line n (text) ran in no test; `before`: the reason of the missed line before it."""
    if text == "}":  # a closing brace: its function's exception cleanup, or the lines above it
        return "the closing brace's exception cleanup (nothing threw)" if counts.get(n - 1, 0) > 0 else before
    for key, why in REASONS.items():
        if key in text:
            return why
    return "NOT EXPLAINED"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", help="build and count in this folder (kept) instead of a temporary one")
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    data_dir = args.keep or tempfile.mkdtemp(prefix="fused_amp_coverage_")
    os.makedirs(data_dir, exist_ok=True)
    for old in glob.glob(os.path.join(data_dir, "*.gc*")):
        os.remove(old)
    # the quick tier (make test's) must run every line
    env = dict(os.environ, FUSED_AMP_EMULATION_COVERAGE=os.path.abspath(data_dir), FUSED_AMP_TEST_TIER="quick")
    subprocess.run([args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS], cwd=ROOT, env=env,
                   check=True)
    counts = gcov_lines(data_dir)
    files = sorted(glob.glob(os.path.join(CUDA, "*.cu")) + glob.glob(os.path.join(CUDA, "*.cuh")) +
                   glob.glob(os.path.join(ROOT, "tests", "cuda_sim", "emulator", "*.h")))
    print("\n| file | lines executed / compiled | |\n|---|---|---|")
    missed, total = [], [0, 0]
    for path in files:
        lines = counts.get(os.path.realpath(path), {})
        if not lines:
            print(f"| {os.path.relpath(path, ROOT)} | not compiled into the emulation | |")
            continue
        run = sum(1 for c in lines.values() if c > 0)
        total[0] += run
        total[1] += len(lines)
        print(f"| {os.path.relpath(path, ROOT)} | {run} / {len(lines)} | {100 * run / len(lines):.1f}% |")
        source = open(path).read().splitlines()
        why = "NOT EXPLAINED"
        for n, c in sorted(lines.items()):
            if c == 0:
                why = reason(source[n - 1].strip(), why, lines, n)
                missed.append((os.path.relpath(path, ROOT), n, source[n - 1].strip(), why))
    print(f"| all | {total[0]} / {total[1]} | {100 * total[0] / max(total[1], 1):.1f}% |")
    print("(lines the preprocessor leaves out of the emulation, the CUDA API calls and <<<>>> launches of\n"
          " the GPU build, are not compiled here and not counted)")
    print(f"\n{len(missed)} lines no test executed:")
    for path, n, text, why in missed:
        print(f"  {path}:{n}: {text}\n      {why}")
    unexplained = sum(why == "NOT EXPLAINED" for *_, why in missed)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
