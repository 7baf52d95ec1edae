#!/usr/bin/env bash
# Builds tools/loop_bench.cpp with the CPU loops of one instruction set (default: the widest this
# CPU has) and runs it: the step loop's ns per element in cache and in memory, by mode.
# Usage: tools/loop_bench.sh [--build-only] [default|avx2|avx512] [MODE]; MODE (a row's name, e.g.
# "8-bit state") times that mode alone, and "8-bit parts" the 8-bit state's dequantize, absmax
# and quantize alone. CI builds it only, so that it keeps compiling.
exec "$(dirname "$0")/with_loops.sh" loop_bench "$@"
