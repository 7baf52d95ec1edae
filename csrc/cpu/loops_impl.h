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

// An optimizer's loop per state kind for params of type T: the element-wise kinds', then the
// code kinds' in storage_kinds.h's order.
template <class Opt, typename T, class... Q>
constexpr Loops::ByStateKind<T> state_loops(CodeKinds<Q...>) {
  return {step_range<Opt, T, Fp32State>, step_range<Opt, T, BF16State>, step_range_codes<Opt, T, Q>...};
}

template <class Opt>
constexpr Loops::Step step_loops() {
  return {state_loops<Opt, float>(CodeKindList{}), state_loops<Opt, c10::Half>(CodeKindList{}),
          state_loops<Opt, c10::BFloat16>(CodeKindList{})};
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
