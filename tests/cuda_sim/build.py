"""Builds the CUDA kernels for the emulator (tests/cuda_sim/harness.cpp) and loads them.

Configurations:
- "plan": small chunks and launch metadata (every boundary of the launch plan is cheap to reach);
- "real": the sizes a GPU runs (chunks of 65536, the 4 KB and 32 KB argument limits);
- "checks": emulator_checks.cpp, the small kernels of the emulator's own tests.
Under `make sanitize` (FUSED_AMP_SANITIZE=1) the build has AddressSanitizer and UBSan too.
FUSED_AMP_EMULATION_CSRC builds another copy of csrc/ (tools/mutate_device_code.py's mutants),
kept beside it;
FUSED_AMP_EMULATION_COVERAGE=DIR builds into DIR with gcov's instrumentation, and the runs
leave their line counts there (tools/emulation_coverage.py).

Run as a script (`python3 tests/cuda_sim/build.py`, any Python 3, no venv), it builds the
checkout's libraries for the environment it is given (FUSED_AMP_SANITIZE) into the folder the
tests look in, one at a time: .ci/run does so while pip installs the venv.
"""
import ctypes
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CUDA_HOME = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
NO_CUDA_HEADERS = None if os.path.exists(os.path.join(CUDA_HOME, "include", "cuda_fp16.h")) else (
    f"no CUDA headers under {CUDA_HOME} (set CUDA_HOME)")
CONFIGS = {  # the source and its defines
    "plan": ("harness.cpp", ["-DFUSED_AMP_SIM_CHUNK_SIZE=2100", "-DFUSED_AMP_SIM_TILE_CHUNK=2560",
                             "-DFUSED_AMP_SIM_MAX_BLOCKS=5", "-DFUSED_AMP_SIM_MAX_TENSORS=3"]),
    "real": ("harness.cpp", []),
    "checks": ("emulator_checks.cpp", []),  # the emulator's own tests
}
# the entry points that return 1 on an error (harness.cpp)
CHECKED = {"fa_sim_unscale", "fa_sim_grad_norm", "fa_sim_update_scale", "fa_sim_step", "fa_sim_delayed_scale_update",
           "fa_check_exchange", "fa_check_order", "fa_check_mistake"}
SCHEDULES = {"in order": 0, "reversed": 1, "random": 2}


class EmulatorError(AssertionError):
    """A finding of the emulator (its first word names the check: race, barrier, warp, init,
    bounds, misaligned), or an argument the launcher refused."""


class Emulation:
    """The harness library; a checked entry point that returns 1 raises EmulatorError."""

    def __init__(self, lib):
        self._lib = lib
        lib.fa_sim_error.restype = ctypes.c_char_p

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if name not in CHECKED:
            return fn

        def call(*args):
            if fn(*args):
                raise EmulatorError(self._lib.fa_sim_error().decode())
        return call

    def step(self, optimizer, lists, kind, n, ptrs, numels, hyper, flags, lr, lr_ptr, *rest):
        """fa_sim_step of `optimizer` over tensors of `lists` pointers each: its hyperparameters
        are `hyper` then `flags` (its booleans), in its descriptor's order (csrc/ops/<name>.h)."""
        values = [float(h) for h in hyper] + [float(f) for f in flags]
        self.fa_sim_step(optimizer.encode(), kind, n, lists, ptrs, numels, (ctypes.c_double * len(values))(*values),
                         lr, lr_ptr, *rest)

    def set_schedule(self, name, seed=0):
        self._lib.fa_sim_set_schedule(SCHEDULES[name], ctypes.c_uint64(seed))


_built = {}


def _command(config, csrc, out):
    """The compiler's command line of `config`'s library at `out`."""
    cxx = shutil.which("g++") or shutil.which("c++")
    # -g1: the line tables, by which the race reports name source lines (addr2line); the whole
    # debug information (-g) made the build a third slower
    flags = ["-O1", "-g1"]
    if os.environ.get("FUSED_AMP_SANITIZE") == "1":  # as setup.py builds the extension for make sanitize
        # -O0: under the sanitizers -O1 took 313 s per library, -O0 124 s; the emulation's tests
        # run a fifth longer (make sanitize's: 350 s against 420 s)
        flags = ["-O0", "-g1", "-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=all"]
    if os.environ.get("FUSED_AMP_EMULATION_COVERAGE"):
        flags = ["-O0", "-g", "--coverage"]
    source, defines = CONFIGS[config]
    return [cxx, *flags, "-shared", "-fPIC", "-std=c++17", f"-I{csrc}", f"-I{os.path.join(ROOT, 'tests', 'cuda_sim')}",
            f"-I{CUDA_HOME}/include",
            "-DFUSED_AMP_HOST_SIM", *defines, os.path.join(ROOT, "tests", "cuda_sim", source), "-o", out]


def _sources():
    """The files the libraries are compiled from: the configs' sources and every header they
    include in quotes, transitively (each #include followed, whatever condition it is under), by
    the compiler's search order: the including file's folder, then the -I folders."""
    folders = [os.path.join(ROOT, "csrc"), os.path.join(ROOT, "tests", "cuda_sim")]
    pending = [os.path.join(ROOT, "tests", "cuda_sim", source) for source, _ in CONFIGS.values()]
    found = set()
    while pending:
        path = pending.pop()
        if path in found:
            continue
        found.add(path)
        text = open(path, errors="replace").read()
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
            for folder in [os.path.dirname(path)] + folders:
                candidate = os.path.normpath(os.path.join(folder, name))
                if os.path.exists(candidate):
                    pending.append(candidate)
                    break
    return sorted(found)


def _kept_dir():
    """build/emulation/<key>: the libraries of this checkout's sources, kept between test runs
    (the key hashes the files they are compiled from, the compiler and each config's flags and
    defines: a change to the CPU loops or the op's validation builds none), so that a second
    run builds nothing."""
    digest = hashlib.sha256(" ".join(" ".join(_command(c, "csrc", "out")) for c in CONFIGS).encode())
    for path in _sources():
        digest.update(os.path.relpath(path, ROOT).encode() + open(path, "rb").read())
    return os.path.join(ROOT, "build", "emulation", digest.hexdigest()[:16])


def library_folder(other_csrc):
    """Where the libraries of another copy of csrc/ are kept: beside it (the mutants' runs of
    tools/mutate_device_code.py share one build)."""
    return os.path.join(os.path.dirname(os.path.abspath(other_csrc)), "emulation")


def compile_libraries(configs, csrc, folder, rebuild=False):
    """{config: library} of `configs` built from `csrc` in `folder`: those not there yet (or all,
    with rebuild) compiled at once, in parallel (two cores build two in the time of one). One
    builder at a time per library (make test's pytest workers share the kept ones); a kept
    library is built under a temporary name first: a run stopped mid-build keeps no half one
    (a rebuilt one under its own, from which gcov names its data files)."""
    os.makedirs(folder, exist_ok=True)
    out = {c: os.path.join(folder, f"libfused_amp_emulation_{c}.so") for c in configs}
    # not the compiler under make sanitize's preloaded ASan runtime: that doubles its time
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    locks = [open(out[c] + ".lock", "w") for c in sorted(configs)]
    try:
        for lock in locks:
            fcntl.flock(lock, fcntl.LOCK_EX)
        suffix = "" if rebuild else ".tmp"
        jobs = [(c, subprocess.Popen(_command(c, csrc, out[c] + suffix), env=env))
                for c in configs if rebuild or not os.path.exists(out[c])]
        for c, job in jobs:
            if job.wait():
                raise subprocess.CalledProcessError(job.returncode, job.args)
            os.replace(out[c] + suffix, out[c])
    finally:
        for lock in locks:
            lock.close()
    return out


def build_emulation(config):
    """The library of `config`, built once per checkout, or per copy of csrc/ named by
    FUSED_AMP_EMULATION_CSRC, or per test session for a coverage build (its line counts start
    from nothing). The checkout's configs not built yet are all compiled at once: the tests need
    them all."""
    if config in _built:
        return _built[config]
    if NO_CUDA_HEADERS:
        import pytest  # (not at the top: the script below runs without it)
        pytest.skip(NO_CUDA_HEADERS)
    other_csrc = os.environ.get("FUSED_AMP_EMULATION_CSRC")
    coverage = os.environ.get("FUSED_AMP_EMULATION_COVERAGE")
    if coverage:
        out = compile_libraries([config], os.path.join(ROOT, "csrc"), coverage, rebuild=True)
    elif other_csrc:
        out = compile_libraries([config], other_csrc, library_folder(other_csrc))
    else:
        out = compile_libraries(list(CONFIGS), os.path.join(ROOT, "csrc"), _kept_dir())
    _built[config] = Emulation(ctypes.CDLL(out[config]))
    return _built[config]


if __name__ == "__main__":
    if NO_CUDA_HEADERS:
        sys.exit(NO_CUDA_HEADERS)
    for name in CONFIGS:  # one at a time: one core's work
        print(compile_libraries([name], os.path.join(ROOT, "csrc"), _kept_dir())[name], flush=True)
