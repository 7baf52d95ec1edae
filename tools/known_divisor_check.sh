#!/usr/bin/env bash
# Builds tools/known_divisor_check.cpp with the CPU loops of one instruction set (default: the
# widest this CPU has) and runs it: ops::div_by_ against the division it replaces, bit for
# bit, over Adam's bias corrections and random divisors (2 minutes with the defaults, 1,000 steps
# and 1,000 random divisors, on 2 cores).
# Usage: tools/known_divisor_check.sh [--build-only] [avx2|avx512] [STEPS] [RANDOM_DIVISORS]. CI builds
# it only, so that it keeps compiling.
exec "$(dirname "$0")/with_loops.sh" known_divisor_check "$@"
