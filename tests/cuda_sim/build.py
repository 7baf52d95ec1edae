"""Builds the CUDA kernels for the emulator (tests/cuda_sim/harness.cpp) and loads them.

Configurations:
- "plan": small chunks and launch metadata (every boundary of the launch plan is cheap to reach);
- "real": the sizes a GPU runs (chunks of 65536, the 4 KB and 32 KB argument limits);
- "checks": emulator_checks.cpp, the small kernels of the emulator's own tests.
Under `make sanitize` (FUSED_AMP_SANITIZE=1) the build has AddressSanitizer and UBSan too.
FUSED_AMP_EMULATION_CSRC builds another copy of csrc/ (tools/mutate_device_code.py's mutants);
FUSED_AMP_EMULATION_COVERAGE=DIR builds into DIR with gcov's instrumentation, and the runs
leave their line counts there (tools/emulation_coverage.py).
"""
import ctypes
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CUDA_HOME = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
CONFIGS = {  # the source and its defines
    "plan": ("harness.cpp", ["-DFUSED_AMP_SIM_CHUNK_SIZE=2100", "-DFUSED_AMP_SIM_TILE_CHUNK=2560",
                             "-DFUSED_AMP_SIM_MAX_BLOCKS=5", "-DFUSED_AMP_SIM_MAX_TENSORS=3"]),
    "real": ("harness.cpp", []),
    "checks": ("emulator_checks.cpp", []),  # the emulator's own tests
}
# the entry points that return 1 on an error (harness.cpp)
CHECKED = {"fa_sim_unscale", "fa_sim_grad_norm", "fa_sim_update_scale", "fa_sim_step",
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


def build_emulation(tmp_dir, config):
    """The library of `config`, built once per test session."""
    if config in _built:
        return _built[config]
    if not os.path.exists(os.path.join(CUDA_HOME, "include", "cuda_fp16.h")):
        pytest.skip(f"no CUDA headers under {CUDA_HOME} (set CUDA_HOME)")
    cxx = shutil.which("g++") or shutil.which("c++")
    csrc = os.environ.get("FUSED_AMP_EMULATION_CSRC") or os.path.join(ROOT, "csrc")
    coverage = os.environ.get("FUSED_AMP_EMULATION_COVERAGE")
    out = os.path.join(coverage or str(tmp_dir), f"libfused_amp_emulation_{config}.so")
    flags = ["-O1", "-g"]  # -g: the race reports name source lines (addr2line)
    if os.environ.get("FUSED_AMP_SANITIZE") == "1":  # as setup.py builds the extension for make sanitize
        flags += ["-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=all"]
    if coverage:
        flags = ["-O0", "-g", "--coverage"]
    source, defines = CONFIGS[config]
    # not the compiler under make sanitize's preloaded ASan runtime: that doubles its time
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    subprocess.run([cxx, *flags, "-shared", "-fPIC", "-std=c++17", f"-I{csrc}", f"-I{CUDA_HOME}/include",
                    "-DFUSED_AMP_HOST_SIM", *defines, os.path.join(ROOT, "tests", "cuda_sim", source),
                    "-o", out], check=True, env=env)
    _built[config] = Emulation(ctypes.CDLL(out))
    return _built[config]
