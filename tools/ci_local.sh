#!/usr/bin/env bash
# make ci-local: what CI checks that a change can break, before submitting it, in about 10
# minutes on 2 cores (docs/development.md, "CI's budget"): the submission marker, the quick tier
# (make test, a worker per core) and beside it, at a lower priority, the mutants of the changed
# files (CPU and device), the emulation's line coverage where its files changed, and the
# sanitizers over the changed files' tests
# (FUSED_AMP_CI_SELECT=local: without CI's rotation, which covers the rest in any 3 consecutive
# CI runs). Each part's log goes to ci-local-*.log; the table at the end says what passed and
# how long each took.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 tools/ci_select.py check --local || exit 1
make build || exit 1
export FUSED_AMP_CI_SELECT=local
RESULTS=$(mktemp)
part() {  # name, command...: runs the command into ci-local-<name>.log and records the outcome
  local name=$1 t0=$SECONDS status=0 cpu
  shift
  cpu=$(mktemp)
  # its CPU seconds too: the parts share 2 cores, so their sum, not the longest, sets the time
  /usr/bin/time -f "%U %S" -o "$cpu" "$@" > "ci-local-$name.log" 2>&1 || status=$?
  printf '| %s | %s | %s | %s |\n' "$name" "$((SECONDS - t0))" "$(awk '{printf "%.0f", $1 + $2}' "$cpu")" \
    "$([[ $status == 0 ]] && echo passed || echo "FAILED ($status)")" >> "$RESULTS"
  rm -f "$cpu"
}
T0=$SECONDS
part tests make test &
# the nets in four streams beside the tests, the sanitizers in one of their own, so that no
# stream is left alone on a core at the end (a change to ops/common.h on an AMD EPYC: 979 s with
# the coverage and the sanitizers in one stream, 327 s of it that stream alone; 736 s in four).
# The sanitizers, a chain of two builds and their tests, run at the tests' priority: at nice 10
# they waited for the tests and then ran alone (cpu/vec_math.h changed, AMD EPYC, one run each:
# 674 s at nice 10, its last 267 s that stream alone; 470 s without)
export OMP_NUM_THREADS=1
part sanitize make sanitize &
part cpu-mutants nice -n 10 .venv/bin/python tools/mutate_cpu_code.py &
{
  part device-mutants nice -n 10 .venv/bin/python tools/mutate_device_code.py --jobs 1
  # as CI: when a file it checks changed (a defensive line without its reason fails it)
  if python3 tools/ci_select.py due emulation-coverage csrc/cuda/ csrc/ops/ tests/cuda_sim/ \
      tests/test_cuda_sim.py tests/test_cuda_emulator.py tools/emulation_coverage.py > /dev/null; then
    part emulation-coverage nice -n 10 .venv/bin/python tools/emulation_coverage.py
  fi
} &
wait
echo "| part (its log: ci-local-PART.log) | s | CPU s | result |"
echo "|---|---|---|---|"
cat "$RESULTS"
echo "| all | $((SECONDS - T0)) | $(awk -F'|' '{s += $4} END {print s}' "$RESULTS") | |"
grep -h -E "^(CPU|device) mutants:|^sanitizers:|passed|failed|NOT EXPLAINED" ci-local-*.log | grep -v "^\." | tail -12
! grep -q FAILED "$RESULTS"
