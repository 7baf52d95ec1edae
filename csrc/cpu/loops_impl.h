// Included once per instruction set, after CPU_CAPABILITY (and the matching target pragma) is
// set: at::vec then compiles Vectorized<float> for that instruction set.
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "ops/common.h"
#include "cpu/vec_math.h"

// The op templates must come after the vector spellings to see them.
#include "cpu/loops.h"
#include "ops/float8.h"
#include "ops/grad_norm.h"
#include "ops/quantize.h"
#include "ops/quantize4.h"
#include "ops/rounding.h"
#include "ops/unscale.h"

namespace fused_amp::cpu::CPU_CAPABILITY {
namespace {

// the loops, by concern; each file is a part of this one
#include "cpu/vec_bits.h"
#include "cpu/unscale_loops.h"
#include "cpu/storage_traits.h"
#include "cpu/epilogues.h"
#include "cpu/step_loops.h"
#include "cpu/quantized_state.h"

template <class Opt>
constexpr Loops::Step step_loops() {
  using BF16 = c10::BFloat16;
  return {{step_range<Opt, float, Fp32State>, step_range<Opt, float, BF16State>, step_range_codes<Opt, float, Codes8>,
           step_range_codes<Opt, float, Codes4>},
          {step_range<Opt, c10::Half, Fp32State>, step_range<Opt, c10::Half, BF16State>,
           step_range_codes<Opt, c10::Half, Codes8>, step_range_codes<Opt, c10::Half, Codes4>},
          {step_range<Opt, BF16, Fp32State>, step_range<Opt, BF16, BF16State>, step_range_codes<Opt, BF16, Codes8>,
           step_range_codes<Opt, BF16, Codes4>}};
}

template <class... Opts>
constexpr auto all_step_loops(OptimizerList<Opts...>) {
  return std::array<Loops::Step, sizeof...(Opts)>{step_loops<Opts>()...};
}

}  // namespace

const Loops& loops() {
  using BF16 = c10::BFloat16;
  static const Loops table = [] {
    Loops t{C10_STRINGIZE(CPU_CAPABILITY),
            unscale_range<float>,
            unscale_range<double>,
            unscale_range<c10::Half>,
            unscale_range<BF16>,
            {norm_range<float, ops::NormKind::Inf>, norm_range<float, ops::NormKind::L1>,
             norm_range<float, ops::NormKind::L2>},
            {norm_range<double, ops::NormKind::Inf>, norm_range<double, ops::NormKind::L1>,
             norm_range<double, ops::NormKind::L2>},
            {norm_range<c10::Half, ops::NormKind::Inf>, norm_range<c10::Half, ops::NormKind::L1>,
             norm_range<c10::Half, ops::NormKind::L2>},
            {norm_range<BF16, ops::NormKind::Inf>, norm_range<BF16, ops::NormKind::L1>,
             norm_range<BF16, ops::NormKind::L2>},
            {}};
    const auto steps = all_step_loops(Optimizers{});
    std::copy(steps.begin(), steps.end(), t.step);
    return t;
  }();
  return table;
}

}  // namespace fused_amp::cpu::CPU_CAPABILITY
