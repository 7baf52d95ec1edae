#pragma once
#include <cstdint>
#include <type_traits>

#include "ops/common.h"

namespace fused_amp::ops {

// x * inv_scale in the op-math type (fp32 for half/float tensors, fp64 for double ones), as
// torch._amp_foreach_non_finite_check_and_unscale_ computes it. `nonfinite` accumulates
// x * 0 and turns NaN once any x was inf or NaN; the caller tests it once per chunk.
template <typename T>
FA_HD T unscale(T x, T inv_scale, T& nonfinite) {
  nonfinite = nonfinite + nonfinite_probe(x);
  return x * inv_scale;
}

// The check alone needs no conversion: a value is inf or NaN exactly when its exponent field is
// all ones. I is the same-width integer (or a vector of them); the result is nonzero (all ones
// in a vector lane) for inf/NaN, so results accumulate with |.
constexpr int16_t kHalfExponent = 0x7C00;
constexpr int16_t kBFloat16Exponent = 0x7F80;
constexpr int32_t kFloatExponent = 0x7F800000;
constexpr int64_t kDoubleExponent = 0x7FF0000000000000LL;

// The integer type with the width of T, to read T's bits as.
template <typename T>
using Bits = std::conditional_t<sizeof(T) == 2, int16_t,
                                std::conditional_t<sizeof(T) == 4, int32_t, int64_t>>;

template <typename I>
FA_HD I exponent_all_ones(I bits, I exponent) {
  return static_cast<I>((bits & exponent) == exponent);
}

}  // namespace fused_amp::ops
