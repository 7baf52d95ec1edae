// The AVX-512 build of the CPU loops, used only when the processor has AVX-512 F/BW/VL/DQ
// (cpu/dispatch.cpp). See loops_avx2.cpp for why a pragma sets the instruction set.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(FUSED_AMP_NO_AVX512_KERNELS)
// avx512bf16: only its conversion's intrinsic emits an instruction of it, where the CPU has it
// (cpu::bf16_conversion); GCC generates none from plain code
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#define __AVX512F__ 1
#define __AVX512BW__ 1
#define __AVX512VL__ 1
#define __AVX512DQ__ 1
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#include "cpu/loops_impl.h"
#else
#include "cpu/loops.h"
namespace fused_amp::cpu::AVX512 { const Loops& loops() { return DEFAULT::loops(); } }
#endif
