#!/usr/bin/env bash
# make sanitize: the CPU kernels and the CUDA kernels on the emulator (tests/cuda_sim/emulator/) built with
# AddressSanitizer and UndefinedBehaviorSanitizer (FUSED_AMP_SANITIZE=1, see setup.py), and the
# tests given as arguments run against that build. The build goes to build-sanitize/ (with a
# copy of the Python package), so the regular build stays as it is.
#
# The interpreter and torch are not built with ASan: the ASan runtime is preloaded so that it
# comes first, and leak detection is off (the interpreter keeps its objects to the end, which
# LeakSanitizer would report as leaks of ours). Every other finding aborts the test process.
#
# tools/sanitize.sh --build-only: the builds alone (the extension, and the emulation's libraries
# under the sanitizers): .ci/run starts them while make build leaves a core idle.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PY:-$ROOT/.venv/bin/python}
OUT=$ROOT/build-sanitize
BUILD_ONLY=false
[[ ${1:-} == --build-only ]] && { BUILD_ONLY=true; shift; }
args=() tests=()
for a in "$@"; do [[ $a == -* ]] && args+=("$a") || { args+=("$ROOT/$a"); tests+=("$a"); }; done
# FUSED_AMP_CI_SELECT=changed (CI): the changed files' tests whole, and a third of the others by
# the submission counter; =local (make ci-local): the changed files' tests alone
# (tools/ci_select.py; tests/conftest.py's FUSED_AMP_TEST_SHARE and FUSED_AMP_TEST_WHOLE).
if ! $BUILD_ONLY && [[ ${FUSED_AMP_CI_SELECT:-} == changed || ${FUSED_AMP_CI_SELECT:-} == local ]]; then
  eval "export $(python3 "$ROOT/tools/ci_select.py" sanitize-share "${tests[@]}")"
  echo "sanitizers: whole: ${FUSED_AMP_TEST_WHOLE:-none}; of the others, share $FUSED_AMP_TEST_SHARE"
  if [[ -z $FUSED_AMP_TEST_WHOLE && $FUSED_AMP_TEST_SHARE == 3/3 ]]; then
    echo "sanitizers: no test of the changed files to run"; exit 0
  fi
fi
mkdir -p "$OUT"
rm -rf "$OUT/fused_amp"
cp -r fused_amp "$OUT/fused_amp"
rm -f "$OUT"/fused_amp/_C*.so
# the CPU kernels of this CPU's instruction set beside the portable ones: the tests run those
FUSED_AMP_SANITIZE=1 FUSED_AMP_CUDA=0 FUSED_AMP_CPU_KERNELS=native MAX_JOBS=${MAX_JOBS:-$(nproc)} \
    "$PY" setup.py build_ext --build-lib "$OUT" --build-temp "$OUT/tmp" > "$OUT/build.log" 2>&1 \
    || { grep -E -A5 "error" "$OUT/build.log" | tail -40; echo "sanitizer build failed: see $OUT/build.log"; exit 1; }
if $BUILD_ONLY; then
  FUSED_AMP_SANITIZE=1 python3 tests/cuda_sim/build.py
  exit 0
fi
CXX=${CXX:-g++}
# reports go to files (pytest's capture of stderr dies with an aborted process)
rm -f "$OUT"/report.*
export LD_PRELOAD="$($CXX -print-file-name=libasan.so) $($CXX -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:log_path=$OUT/report.asan
export UBSAN_OPTIONS=print_stacktrace=1:log_path=$OUT/report.ubsan
export FUSED_AMP_SANITIZE=1  # tests/cuda_sim/build.py builds the emulation with the sanitizers too
# The quick tier of those tests (every parameter value at least once: the code paths the
# sanitizers watch), each optimizer's plain and stateful option sets (tests/optim_registry.py):
# 700 tests in about a quarter of the whole matrix's 40 minutes under ASan, most of which the
# emulation takes. FUSED_AMP_TEST_TIER=full runs all 2009.
export FUSED_AMP_TEST_TIER=${FUSED_AMP_TEST_TIER:-quick}
export FUSED_AMP_TEST_OPTION_SETS=${FUSED_AMP_TEST_OPTION_SETS:-2}
cd "$OUT"  # so that `import fused_amp` finds the sanitizer build first
"$PY" -c "import fused_amp, sys; print('sanitizer build:', fused_amp.__file__); sys.exit(0 if '$OUT' in fused_amp.__file__ else 1)"
status=0
"$PY" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" "${args[@]}" || status=$?
[[ $status == 5 && -n ${FUSED_AMP_TEST_SHARE:-} ]] && { echo "sanitizers: no test in this share"; status=0; }
# The CUDA emulator switches fibers with swapcontext, announcing each switch to ASan
# (__sanitizer_start/finish_switch_fiber, tests/cuda_sim/emulator/fiber.h); ASan still warns once that
# it "doesn't fully support makecontext/swapcontext". That warning alone is no finding.
CONTEXT_WARNING="WARNING: ASan doesn't fully support makecontext/swapcontext"
for report in "$OUT"/report.*; do
  [[ -e $report ]] || continue
  grep -v -e "$CONTEXT_WARNING" "$report" | grep -q . || continue
  echo "=== $report"; cat "$report"; status=1
done
exit $status
