#!/usr/bin/env bash
# Builds tools/loop_bench.cpp against the installed torch's headers, with the CPU loops of one
# instruction set (default: the widest this CPU has, as the extension picks it), and runs it.
# Usage: tools/loop_bench.sh [--build-only] [default|avx2|avx512] [MODE]; the Python is $PY or
# .venv/bin/python; MODE (a row's name, e.g. "8-bit state") times that mode alone, and "8-bit
# parts" the 8-bit state's dequantize, absmax and quantize alone. CI builds it only, so that it
# keeps compiling.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_ONLY=0
if [[ "${1:-}" == "--build-only" ]]; then BUILD_ONLY=1; shift; fi
PY="${PY:-.venv/bin/python}"
# torch's choice, which csrc/cpu/dispatch.cpp follows (cpuinfo and ATEN_CPU_CAPABILITY)
case "$("$PY" -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')" in
  AVX512) ISA=avx512 ;;
  AVX2) ISA=avx2 ;;
  *) ISA=default ;;
esac
ISA="${1:-$ISA}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
read -r -a INCLUDES <<< "$("$PY" -c 'from torch.utils.cpp_extension import include_paths; print(" ".join("-I" + p for p in include_paths()))' 2>/dev/null)"
LIB="$("$PY" -c 'from torch.utils.cpp_extension import library_paths; print(library_paths()[0])' 2>/dev/null)"
# the extension's flags (setup.py): contraction off, so that each fma_ is one and nothing else fuses
g++ -O3 -std=c++20 -ffp-contract=off -Wno-psabi -Icsrc "${INCLUDES[@]}" -DLOOPS_FILE="\"cpu/loops_${ISA}.cpp\"" \
  tools/loop_bench.cpp -o "$WORK/loop_bench" -L"$LIB" -lc10 -Wl,-rpath,"$LIB"
echo "tools/loop_bench.cpp built with the ${ISA} loops"
if [[ "$BUILD_ONLY" == 0 ]]; then "$WORK/loop_bench" "${@:2}"; fi
