#pragma once
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

template <typename T>
FA_HD void check_finite(T x, T& nonfinite) {
  nonfinite = nonfinite + nonfinite_probe(x);
}

}  // namespace fused_amp::ops
