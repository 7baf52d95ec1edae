#!/usr/bin/env python3
"""The GPU check: everything a CPU machine cannot settle, in one call on a machine with an
NVIDIA GPU and its own torch (``make gpu-check``).

Steps, in order, each with its log under the output folder (``FUSED_AMP_GPU_OUT``, default
``gpu-results/``) and a time limit taken from a total budget (``--budget``, 400 s):

1. info       the GPU, torch, CUDA and the interpreter
2. build      fused_amp._C in place for this GPU's architecture only (all cores)
3. cuda-tests ``pytest -m cuda``
4. tests      the rest of the suite (``pytest -m "not cuda"``)
5. bench      ``python -m fused_amp.benchmark --device cuda --quick``
6. sanitizer  the CUDA tests of the ops under ``compute-sanitizer --tool memcheck``
7. racecheck  those of the kernels with shared memory and block reductions (the clipping
8. synccheck  norm, 8-bit state) under the racecheck and synccheck tools (6-8 optional: only where
              compute-sanitizer exists and time is left)

It never reads input and always ends with a summary (summary.txt and summary.json), whatever
failed. ``--dry-run`` runs the same steps on a machine without a GPU (the CUDA build is
compiled, CUDA tests skip, the benchmark runs a tiny CPU case) so that the script itself is
tested where CI runs.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = ("info", "build", "cuda-tests", "tests", "bench", "sanitizer", "racecheck", "synccheck")
# (step, compute-sanitizer tool, the tests it runs, seconds): memcheck over the ops' CUDA tests;
# racecheck and synccheck over the kernels with shared memory and block reductions (the norm,
# the tiles of 8-bit state)
SANITIZER_RUNS = (("sanitizer", "memcheck", ["tests/test_unscale.py", "tests/test_update_scale.py"], 120),
                  ("racecheck", "racecheck", ["tests/test_cuda.py", "-k", "grad_norm or 8-bit or muon_momentum"], 60),
                  ("synccheck", "synccheck", ["tests/test_cuda.py", "-k", "grad_norm or 8-bit or muon_momentum"], 60))
INFO = r"""
import os, sys, torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda)
ok = torch.cuda.is_available()
print("cuda available", ok)
if ok:
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"gpu {i}: {p.name}, capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB")
print("cpus", os.cpu_count())
"""


def gpu_arch(python):
    """TORCH_CUDA_ARCH_LIST for the first GPU ("9.0" on an H200), or None without one."""
    code = ("import torch; c = torch.cuda.get_device_capability() if torch.cuda.is_available() "
            "else None; print(f'{c[0]}.{c[1]}' if c else '')")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return out.stdout.strip() or None


class Check:
    def __init__(self, out, budget, python):
        self.out, self.python = out, python
        self.deadline = time.monotonic() + budget
        self.results = []
        os.makedirs(out, exist_ok=True)

    def left(self):
        return self.deadline - time.monotonic()

    def run(self, step, cmd, limit, env=None, keep=None):
        """Runs ``cmd`` with its output in OUT/step.log; records status, time and the lines
        ``keep(text)`` picks for the summary."""
        log = os.path.join(self.out, f"{step}.log")
        timeout = min(limit, self.left() - 5)
        if timeout < 10:
            return self.record(step, "skipped", 0.0, ["no time left in the budget"])
        start = time.monotonic()
        header = "$ " + " ".join(cmd) + "\n"
        with open(log, "w") as f:
            f.write(header)
            f.flush()
            try:
                proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, **(env or {})),
                                      stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      timeout=timeout)
                status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
            except subprocess.TimeoutExpired:
                status = f"timeout ({timeout:.0f} s)"
        with open(log) as f:
            text = f.read()[len(header):]
        lines = keep(text) if keep else []
        if not status.startswith("ok") and not lines:
            lines = text.strip().splitlines()[-5:]
        return self.record(step, status, time.monotonic() - start, lines)

    def record(self, step, status, seconds, lines):
        self.results.append(dict(step=step, status=status, seconds=round(seconds, 1), lines=lines))
        print(f"[gpu-check] {step}: {status} ({seconds:.0f} s)", flush=True)
        return status == "ok"

    def summary(self, header):
        text = [header] + [f"{r['step']:<11} {r['status']:<22} {r['seconds']:>6.1f} s" + "".join(
            f"\n    {line}" for line in r["lines"]) for r in self.results]
        with open(os.path.join(self.out, "summary.txt"), "w") as f:
            f.write("\n".join(text) + "\n")
        with open(os.path.join(self.out, "summary.json"), "w") as f:
            json.dump(dict(header=header, steps=self.results), f, indent=1)
        print("\n".join(["", "=" * 30 + " gpu-check summary " + "=" * 30] + text), flush=True)


def pytest_tail(text):
    """pytest's closing line, and the skip/fail lines (-rfEs)."""
    lines = text.strip().splitlines()
    picked = [ln for ln in lines if ln.startswith(("FAILED", "ERROR", "SKIPPED"))][:15]
    return picked + lines[-1:]


def bench_summary(text):
    """The report's summary and per-case verdicts: what follows the first blank line (after the
    progress bars)."""
    lines = text.strip().splitlines()
    start = next((i for i, ln in enumerate(lines) if not ln.strip()), None)
    return [ln for ln in lines[start:] if ln.strip()][:30] if start is not None else lines[-3:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("FUSED_AMP_GPU_OUT", "gpu-results"))
    ap.add_argument("--budget", type=float, default=400.0, help="seconds for all steps together")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: run every step in its CPU form")
    ap.add_argument("--skip-build", action="store_true", help="use the extension already built")
    ap.add_argument("--pytest-args", default="", help="restrict the test steps (e.g. a file)")
    ap.add_argument("--arch", default=None, help="TORCH_CUDA_ARCH_LIST (default: the GPU's)")
    args = ap.parse_args(argv)
    python = sys.executable
    check = Check(os.path.abspath(args.out), args.budget, python)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    arch = args.arch or gpu_arch(python)
    if arch is None and not args.dry_run:
        check.record("info", "failed", 0.0, ["no CUDA GPU visible to torch (use --dry-run without one)"])
        check.summary(f"gpu-check {started}: no GPU")
        return 1
    arch = arch or "9.0"
    check.run("info", [python, "-c", INFO], 60, keep=lambda t: t.strip().splitlines())
    env = dict(FUSED_AMP_CUDA="1", TORCH_CUDA_ARCH_LIST=arch, MAX_JOBS=str(os.cpu_count() or 1),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if args.skip_build:
        check.record("build", "skipped", 0.0, ["--skip-build"])
        built = True
    else:
        built = check.run("build", [python, "setup.py", "build_ext", "--inplace"], 240, env,
                          keep=lambda t: [ln for ln in t.splitlines() if "error" in ln.lower()][:10])
    if built:
        extra = args.pytest_args.split()
        pytest = [python, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider"]
        check.run("cuda-tests", pytest + ["-m", "cuda"] + extra, 150, env, keep=pytest_tail)
        check.run("tests", pytest + ["-m", "not cuda"] + extra, 240, env, keep=pytest_tail)
        bench = [python, "-m", "fused_amp.benchmark"] + (
            ["--device", "cpu", "--quick", "--size-scale", "0.002", "--suite", "unscale"] if args.dry_run else
            ["--device", "cuda", "--quick"])
        check.run("bench", bench + ["--out", os.path.join(check.out, "bench")], 150, env,
                  keep=bench_summary)
        cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        sanitizer = shutil.which("compute-sanitizer") or next(
            (p for p in [os.path.join(cuda_home, "bin", "compute-sanitizer")] if os.path.exists(p)), None)
        if sanitizer and not args.dry_run:
            for step, tool, tests, limit in SANITIZER_RUNS:
                check.run(step, [sanitizer, "--tool", tool, "--error-exitcode", "9", *pytest,
                                 "-m", "cuda", "-x", *tests], limit, env, keep=pytest_tail)
        else:
            for step, _, _, _ in SANITIZER_RUNS:
                check.record(step, "skipped", 0.0,
                             ["dry run" if args.dry_run else "compute-sanitizer not found"])
    else:
        for step in STEPS[2:]:
            check.record(step, "skipped", 0.0, ["the build failed"])
    failed = [r["step"] for r in check.results if r["status"] not in ("ok", "skipped")]
    check.summary(f"gpu-check {started}, arch {arch}{' (dry run)' if args.dry_run else ''}: "
                  + ("all steps ok" if not failed else "FAILED: " + ", ".join(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
