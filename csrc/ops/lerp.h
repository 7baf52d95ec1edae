#pragma once
// torch.lerp's rounding, for the optimizers whose torch reference interpolates with lerp_. A
// template over T = float or a vector of floats: included after the vector spellings of fma_
// (cpu/vec_math.h), as every op header is.
#include "ops/common.h"

namespace fused_amp::ops {

// a + w (b - a) as torch.lerp forms it in its vector kernel (CPU) and its CUDA kernel, where
// both forms are one fused multiply-add: from a when |w| < 0.5, else from b.
template <typename T>
FA_HD T torch_lerp_(T a, T b, float w) {
  return w < 0.5f && w > -0.5f ? fma_(T(w), b - a, a) : fma_(T(w - 1.f), b - a, b);
}

}  // namespace fused_amp::ops
