// The AVX2 build of the CPU loops, used only when the processor has AVX2 and FMA (cpu/dispatch.cpp).
// The pragma, not a -mavx2 flag, scopes the instruction set to this file: setup.py compiles
// every source with the same flags. The pragma changes code generation but not the predefined
// macros, which at::vec and sleef test, so they are set here by hand.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(FUSED_AMP_NO_AVX2_KERNELS)
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include "cpu/loops_impl.h"
#else
#include "cpu/loops.h"
namespace fused_amp::cpu::AVX2 { const Loops& loops() { return DEFAULT::loops(); } }
#endif
