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

// A divisor known before the loop (a bias correction), with its reciprocal r = RN(1/d): x / d
// rounded once, as the division rounds it, by a multiply and two FMAs, where a vector division
// costs an AVX-512 core about as much as 20 FMAs (Markstein's theorem, as Brisebarre, Muller and
// Raina use it for a divisor known in advance, IEEE Trans. Computers 53(8), 2004): q = RN(x r) is
// within an ulp of x / d, the FMA gives the remainder x - q d exactly, and RN(q + remainder r) is
// RN(x / d). It holds for d in [2^-27, 1] and x zero or in [2^-75, 2^64], the square roots of
// fp32 values (the remainder's exponent in fp32's range, the quotient far from overflow). Such
// are sqrt(1 - beta2^t) for a beta2 in [0, 1) (1 - beta2^t is 2^-53 or more in double); an inf
// or NaN x, or d = 0, gives q, as the division does. tools/known_divisor_check.sh checks it bit
// for bit. The builds without FMA divide.
struct KnownDivisor {
  float d, r;
};
FA_HD KnownDivisor known_divisor(float d) { return {d, 1.f / d}; }
FA_HD float div_by_(float x, KnownDivisor k) {
#if defined(FUSED_AMP_NO_FMA)
  return x / k.d;
#else
  const float q = x * k.r;
  return is_finite(q) ? fma_(fma_(-q, k.d, x), k.r, q) : q;
#endif
}

}  // namespace fused_amp::ops
