#include <ATen/Version.h>

#include "cpu/loops.h"

namespace fused_amp::cpu {

const Loops& loops() {
  // torch decides once per process from cpuinfo and ATEN_CPU_CAPABILITY; following it keeps
  // our kernels on the instruction set torch trusts on this machine.
  static const Loops& chosen = [] () -> const Loops& {
    const std::string cap = at::get_cpu_capability();
    if (cap == "AVX512") return AVX512::loops();
    if (cap == "AVX2") return AVX2::loops();
    return DEFAULT::loops();
  }();
  return chosen;
}

}  // namespace fused_amp::cpu
