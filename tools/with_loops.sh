#!/usr/bin/env bash
# Builds the program tools/NAME.cpp against the installed torch's headers, with the CPU loops of
# one instruction set (default: the widest this CPU has, as the extension picks it) and
# csrc/cpu/features.cpp (what the CPU has beyond that set), and runs it with ARGS.
# Usage: tools/with_loops.sh NAME [--build-only] [default|avx2|avx512] [ARGS...]; the
# Python is $PY or .venv/bin/python. tools/loop_bench.sh and tools/known_divisor_check.sh call it.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME="$1"
shift
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
  "tools/$NAME.cpp" csrc/cpu/features.cpp -o "$WORK/$NAME" -L"$LIB" -lc10 -Wl,-rpath,"$LIB"
echo "tools/$NAME.cpp built with the ${ISA} loops"
if [[ "$BUILD_ONLY" == 0 ]]; then "$WORK/$NAME" "${@:2}"; fi
