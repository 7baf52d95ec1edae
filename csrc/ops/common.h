#pragma once
// Shared by the CPU loops (T = float or at::vec::Vectorized<float>) and the CUDA kernels
// (T = float). Everything here is the per-element math; launching lives elsewhere. Functions
// have internal linkage: each CPU instruction-set build keeps its own copy, none is merged.
#include <cmath>

#if defined(__CUDACC__)
#define FA_HD static __host__ __device__ __forceinline__
#else
#define FA_HD static inline
#endif

namespace fused_amp::ops {

// Scalar spellings of the few functions the math needs; the CPU build adds the same names for
// Vectorized<float> (cpu/vec_math.h) before including the op headers.
FA_HD float sqrt_(float x) { return sqrtf(x); }
FA_HD float max_(float a, float b) { return a < b ? b : a; }
// max(a, b) that returns NaN when either is NaN, as torch.maximum and
// torch.linalg.vector_norm(ord=inf) do
FA_HD float nan_max_(float a, float b) { return (a < b || b != b) ? b : a; }
FA_HD double nan_max_(double a, double b) { return (a < b || b != b) ? b : a; }
FA_HD float abs_(float x) { return fabsf(x); }
FA_HD double abs_(double x) { return fabs(x); }
// torch.sign: -1, 0 or 1; NaN stays NaN
FA_HD float sign_(float x) { return x > 0.f ? 1.f : (x < 0.f ? -1.f : (x == x ? 0.f : x)); }
// a where x > 0, else b (NaN is not > 0), as torch.where(x.gt(0), a, b)
FA_HD float where_positive_(float x, float a, float b) { return x > 0.f ? a : b; }
#if defined(FUSED_AMP_NO_FMA)
// The portable CPU build: the processor may lack FMA, and at::vec's portable fmadd (like torch's
// own portable kernels) rounds a * b + c twice; the scalar path does the same.
FA_HD float fma_(float a, float b, float c) { return a * b + c; }
FA_HD double fma_(double a, double b, double c) { return a * b + c; }
#else
FA_HD float fma_(float a, float b, float c) { return fmaf(a, b, c); }
FA_HD double fma_(double a, double b, double c) { return ::fma(a, b, c); }
#endif
// Becomes NaN when x is inf or NaN, stays +-0 otherwise: x * 0 folds "is finite" into an add.
FA_HD float nonfinite_probe(float x) { return x * 0.f; }
FA_HD double nonfinite_probe(double x) { return x * 0.0; }
FA_HD bool any_nan(float x) { return x != x; }
FA_HD bool is_finite(float x) { return x - x == 0.f; }
FA_HD bool any_nan(double x) { return x != x; }

}  // namespace fused_amp::ops
