"""Build fused_amp._C: CPU kernels always, CUDA kernels when torch and a toolkit allow.

Environment variables read here (all documented in docs/install.md, which README links):
  FUSED_AMP_CUDA        unset: CUDA when possible; 0: CPU only; 1: CUDA or fail.
  TORCH_CUDA_ARCH_LIST  CUDA architectures (default: those of the GPUs torch sees; with none,
                        the oldest of 8.0;8.6;8.9;9.0;10.0 that nvcc builds, +PTX for the rest;
                        a wheel for others to install sets it, e.g. to that whole list).
  CUDA_HOME / CUDA_PATH the CUDA toolkit (default: /usr/local/cuda when it exists).
  MAX_JOBS              parallel compile jobs (read by torch's ninja builder).
  FUSED_AMP_SANITIZE    1: compile the CPU kernels with AddressSanitizer and
                        UndefinedBehaviorSanitizer (make sanitize; not for use otherwise).
  FUSED_AMP_CPU_KERNELS unset: the CPU kernels for AVX2 and AVX-512 beside the portable ones;
                        a comma list of avx2, avx512 (or none): only those, the CPUs of the
                        others running the portable ones; native: this CPU's (make sanitize,
                        the CPU mutants, the sdist check).
"""
import glob
import os
import shutil
import subprocess

from setuptools import setup

DEFAULT_ARCHS = "8.0;8.6;8.9;9.0;10.0"  # the Tensor Core GPUs users train on
# with FUSED_AMP_SANITIZE=1; float-cast-overflow is UB that -fsanitize=undefined leaves out
SANITIZERS = ["-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=all"]


def _cuda_home():
    # torch guesses the toolkit from `which nvcc`, wrong when nvcc is a wrapper script.
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home and os.path.exists("/usr/local/cuda"):
        home = "/usr/local/cuda"
    if home:
        os.environ["CUDA_HOME"] = home
    return home


def _default_archs(torch, cuda_home):
    """The archs of the GPUs torch sees (the build a user waits for is theirs alone); with none,
    one arch and its PTX, which the driver compiles for any newer GPU. Either way only what this
    nvcc can build (sm_100 needs CUDA 12.8)."""
    nvcc = os.path.join(cuda_home or "", "bin", "nvcc")
    try:
        listed = subprocess.run([nvcc if os.path.exists(nvcc) else "nvcc", "--list-gpu-arch"],
                                capture_output=True, text=True, check=True).stdout.split()
        known = {a.replace("compute_", "") for a in listed}
    except (OSError, subprocess.CalledProcessError):
        known = None
    seen = sorted({"%d.%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    seen = [a for a in seen if known is None or a.replace(".", "") in known]
    if seen:
        return ";".join(seen)
    buildable = [a for a in DEFAULT_ARCHS.split(";") if known is None or a.replace(".", "") in known]
    return (buildable or DEFAULT_ARCHS.split(";"))[0] + "+PTX"


def _want_cuda(torch, cuda_home):
    """The one place that decides between a CPU-only and a CUDA build."""
    mode = os.environ.get("FUSED_AMP_CUDA", "")
    nvcc = cuda_home and os.path.exists(os.path.join(cuda_home, "bin", "nvcc"))
    possible = bool(torch.version.cuda) and bool(nvcc or shutil.which("nvcc"))
    if mode == "0":
        return False
    if mode == "1" and not possible:
        raise RuntimeError(
            "FUSED_AMP_CUDA=1 but no CUDA build is possible: "
            f"torch.version.cuda={torch.version.cuda!r}, CUDA toolkit (nvcc) "
            f"{'not found' if not nvcc else 'found at ' + cuda_home}. "
            "Install a CUDA build of torch and the CUDA toolkit, or set CUDA_HOME.")
    return possible


cuda_home = _cuda_home()
import torch  # noqa: E402  (after CUDA_HOME is settled)
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402

with_cuda = _want_cuda(torch, cuda_home)
sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/core/*.cpp") + glob.glob("csrc/cpu/*.cpp"))
# -fopenmp: at::parallel_for is an OpenMP pragma in a header, compiled into our objects; the
# runtime resolves to the libgomp.so.1 that torch has already loaded (one thread pool).
# No contraction of a*b+c into an FMA behind our back: the scalar and vector paths (and the
# GPU) then compute the same IEEE operations, and where an element falls changes no bit.
# -g0: no debug information, which Python's CFLAGS ask for (-g): it made each object ten times
# larger and its compile a quarter to a half slower.
cxx_flags = ["-O3", "-g0", "-fopenmp", "-ffp-contract=off", f'-DFUSED_AMP_TORCH_VERSION="{torch.__version__}"']
link_flags = ["-fopenmp"]
kernels = os.environ.get("FUSED_AMP_CPU_KERNELS", "avx2,avx512").split(",")
if kernels == ["native"]:  # the instruction set torch picks here
    kernels = [torch.backends.cpu.get_cpu_capability().lower()]
if set(kernels) - {"avx2", "avx512", "none", "default"}:
    raise RuntimeError(f"FUSED_AMP_CPU_KERNELS must be a comma list of avx2 and avx512, or none, or native; "
                       f"got {kernels}")
cxx_flags += [f"-DFUSED_AMP_NO_{isa.upper()}_KERNELS" for isa in ("avx2", "avx512") if isa not in kernels]
if os.environ.get("FUSED_AMP_SANITIZE") == "1":  # any finding aborts the process
    # (-g1: the line tables, by which the reports name source lines)
    cxx_flags = [f for f in cxx_flags if f not in ("-O3", "-g0")] + ["-O1", "-g1", "-fno-omit-frame-pointer"]
    cxx_flags += SANITIZERS
    link_flags += SANITIZERS
if with_cuda:
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST") or _default_archs(torch, cuda_home)
    os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    sources += sorted(glob.glob("csrc/cuda/*.cpp") + glob.glob("csrc/cuda/*.cu"))
    cxx_flags += ["-DFUSED_AMP_WITH_CUDA", f'-DFUSED_AMP_CUDA_ARCHS="{archs}"']
    ext = CUDAExtension(
        "fused_amp._C", sources, include_dirs=[os.path.abspath("csrc")],
        extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "--fmad=false", "-DFUSED_AMP_WITH_CUDA"]},
        extra_link_args=link_flags)
else:
    ext = CppExtension("fused_amp._C", sources, include_dirs=[os.path.abspath("csrc")],
                       extra_compile_args=cxx_flags, extra_link_args=link_flags)


class BuildInKeptFolder(BuildExtension.with_options(use_ninja=True)):
    """Objects stay in build/ext (unless --build-temp says where), so ninja recompiles only
    what changed since the last build. pip's editable install would otherwise build in a fresh
    temporary folder each time."""

    def finalize_options(self):
        chosen = self.build_temp  # given on the command line (make sanitize, the mutants)
        super().finalize_options()
        self.build_temp = chosen or os.path.join(os.path.dirname(os.path.abspath(__file__)), "build", "ext")


setup(ext_modules=[ext], cmdclass={"build_ext": BuildInKeptFolder})
