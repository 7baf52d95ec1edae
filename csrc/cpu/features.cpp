// What the CPU has beyond the instruction set torch picked (cpu/dispatch.cpp), read once at load.
// A file of its own, compiled for any x86-64, which the loop harnesses link beside one
// instruction set's loops (tools/with_loops.sh).
#include <cstdlib>
#include <cstring>

#include "cpu/loops.h"

namespace fused_amp::cpu {

const bool bf16_conversion = [] {
#if defined(__x86_64__) && defined(__GNUC__)
  const char* wanted = std::getenv("FUSED_AMP_CPU_BF16");
  __builtin_cpu_init();  // (a library's initializer may run before libgcc's)
  return __builtin_cpu_supports("avx512bf16") && !(wanted && std::strcmp(wanted, "0") == 0);
#else
  return false;
#endif
}();

}  // namespace fused_amp::cpu
