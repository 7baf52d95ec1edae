#pragma once
// The global gradient norm and the clip coefficient, per element, for the CPU loops
// (T = float/double or a vector of them) and the CUDA kernels. The norm is that of the unscaled
// grads, x * inv_scale, formed in the op-math type as the unscale pass forms it.
#include "ops/common.h"

namespace fused_amp::ops {

// Which norm: torch.nn.utils.clip_grad_norm_'s norm_type 1.0, 2.0 or inf.
enum class NormKind : int { Inf = 0, L1 = 1, L2 = 2 };

// Folds one unscaled element u into the running value `acc` of a norm kind.
template <NormKind kKind, typename T>
FA_HD T norm_accumulate(T acc, T u) {
  if constexpr (kKind == NormKind::L2) {
    return fma_(u, u, acc);
  } else if constexpr (kKind == NormKind::L1) {
    return acc + abs_(u);
  } else {
    return nan_max_(acc, abs_(u));
  }
}

// Combines two partial values of a norm kind (sums, or maxima).
template <typename T>
FA_HD T norm_combine(NormKind kind, T a, T b) {
  return kind == NormKind::Inf ? nan_max_(a, b) : a + b;
}

// The norm from the combined partial value: sqrt of the sum of squares for L2.
FA_HD float norm_finish(NormKind kind, double total) {
  return static_cast<float>(kind == NormKind::L2 ? sqrt(total) : total);
}

// min(1, max_norm / (total_norm + 1e-6)) as torch.nn.utils.clip_grad_norm_ forms it in fp32:
// `max_norm / t` is `t.reciprocal() * max_norm` for a tensor t, and clamp keeps a NaN.
FA_HD float clip_coef(float total_norm, float max_norm) {
  const float coef = (1.f / (total_norm + 1e-6f)) * max_norm;
  return coef > 1.f ? 1.f : coef;
}

}  // namespace fused_amp::ops
