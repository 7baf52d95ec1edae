#pragma once
// 8-bit blockwise optimizer state (state_dtype=torch.uint8): the math of one element's code.
// Each state tensor is cut into blocks of kQuantBlock elements in its memory order (the last
// block of a tensor may be shorter); a block keeps one fp32 absmax and one 8-bit code per
// element. One closed-form map (no table search) serves both kinds of state: sqrt(|x| / absmax)
// is coded linearly and rounded to nearest (ties to even),
//   signed states (exp_avg, momentum_buffer):      x = absmax * sign(c) (c / 127)^2,  c in [-127, 127]
//   unsigned states (exp_avg_sq, max_exp_avg_sq):  x = absmax * (c / 255)^2,          c in [0, 255]
// chosen by measurement (benchmarks/quant_maps.py, on the char LM's moments: within 10% of the
// error of coding sqrt(sqrt(v)) for the second moment, which costs one more square root per
// element, and more accurate than linear codes or bitsandbytes' dynamic map, which at blocks of
// 2048 let a v dequantize to 0). A positive unsigned value never codes to 0: the denominator of
// Adam's update stays at least sqrt(absmax) / 255, which bounds every element's update (|m| /
// sqrt(v) stays within a small factor of its fp32-state bound) where a v that dequantizes to 0
// beside a nonzero m would move the weight by lr * m / eps.
// Optionally (stochastic_rounding=True) a code is rounded stochastically instead, so that its
// value is unbiased: E[dequantized] = x (quantize_*_stochastic below).
// T = float (the CUDA kernels, the CPU's scalar elements) or a vector of floats (cpu/).
#include <cfloat>
#include <cstdint>

#include "ops/common.h"

namespace fused_amp::ops {

constexpr int64_t kQuantBlock = 256;
constexpr float kSignedLevels = 127.f;
constexpr float kUnsignedLevels = 255.f;

// min and max of values that are never NaN here (a block is coded only when its absmax is finite)
FA_HD float unit_min_(float a, float b) { return a < b ? a : b; }
FA_HD float code_max_(float a, float b) { return a > b ? a : b; }
FA_HD float rint_(float x) { return rintf(x); }
FA_HD float floor_(float x) { return floorf(x); }
FA_HD float copysign_(float magnitude, float sign) { return copysignf(magnitude, sign); }
// 1 where x > 0, else 0
FA_HD float positive_(float x) { return x > 0.f ? 1.f : 0.f; }

FA_HD float where_top_(float code, float top, float exact, float value) { return code == top ? exact : value; }

// The value of a code (as a float) in a block with the given absmax: its square (signed for
// signed codes) times absmax / levels^2. The top code gives the absmax itself, so that the block's largest
// value is its absmax and quantizing the values of a block again gives its codes and absmax back:
// a checkpoint of fp32 moments resumes bit for bit.
template <typename T>
FA_HD T dequantize_signed(T code, float absmax) {
  const T magnitude = abs_(code);
  const T value = code * magnitude * T(absmax / (kSignedLevels * kSignedLevels));
  return where_top_(magnitude, kSignedLevels, copysign_(T(absmax), code), value);
}
template <typename T>
FA_HD T dequantize_unsigned(T code, float absmax) {
  const T value = code * code * T(absmax / (kUnsignedLevels * kUnsignedLevels));
  return where_top_(code, kUnsignedLevels, T(absmax), value);
}

// The code (an integral float) of x in a block whose absmax is finite and at least FLT_MIN,
// given inv_absmax = 1 / absmax.
template <typename T>
FA_HD T quantize_signed(T x, float inv_absmax) {
  const T unit = unit_min_(abs_(x) * T(inv_absmax), T(1.f));
  return copysign_(rint_(sqrt_(unit) * T(kSignedLevels)), x);
}
template <typename T>
FA_HD T quantize_unsigned(T x, float inv_absmax) {
  const T unit = unit_min_(x * T(inv_absmax), T(1.f));
  return code_max_(rint_(sqrt_(unit) * T(kUnsignedLevels)), positive_(x));
}

// Stochastic rounding of a code's magnitude, given unit = |x| / absmax in [0, 1] and 15 random
// bits (an integral float in [0, 2^15)). The magnitudes c and c + 1 around x are the integers
// whose squares bracket t = unit * levels^2 (a code's value is absmax * (c / levels)^2), so x
// rounds up with probability (t - c^2) / (2c + 1): the expected value is absmax * t / levels^2,
// x itself, to within 2^-15 of one code's step. (Where t lies just below a square k^2 and its
// square root rounds up to k, c = k and x stays at k: it would round down with a probability
// below 2^-17.) Every product here is of integers below 2^24, so exact: the bits are the same
// with or without fused multiply-adds, on every device.
template <typename T>
FA_HD T stochastic_magnitude_(T unit, float levels, T random15) {
  const T t = unit * T(levels * levels);
  const T c = floor_(sqrt_(t));
  const T up = positive_((t - c * c) * T(32768.f) - random15 * fma_(c, T(2.f), T(1.f)));
  return c + up;
}
template <typename T>
FA_HD T quantize_signed_stochastic(T x, float inv_absmax, T random15) {
  const T unit = unit_min_(abs_(x) * T(inv_absmax), T(1.f));
  return copysign_(stochastic_magnitude_(unit, kSignedLevels, random15), x);
}
template <typename T>
FA_HD T quantize_unsigned_stochastic(T x, float inv_absmax, T random15) {
  const T unit = unit_min_(x * T(inv_absmax), T(1.f));
  return code_max_(stochastic_magnitude_(unit, kUnsignedLevels, random15), positive_(x));
}
// The 15 random bits of an element's code from its 32 (ops::rounding_bits): the low half rounds
// signed states (exp_avg, the momentum buffer), the high half unsigned ones (exp_avg_sq, and
// max_exp_avg_sq with the same bits), as bf16 state takes them. B = uint32_t, or a vector of them (cpu/).
template <typename B>
FA_HD B code_random15(B bits, bool is_signed) { return (is_signed ? bits & 0xffffu : bits >> 16) >> 1; }

// A block whose absmax is below FLT_MIN (zero, or values too small to matter next to any eps)
// is stored as zeros; one whose absmax is inf or NaN keeps it with all codes 0, so that the
// whole block reads back as NaN: a NaN in the math is never turned into a finite code.
FA_HD bool codes_block(float absmax) { return absmax >= FLT_MIN && absmax <= FLT_MAX; }
FA_HD float stored_absmax(float absmax) { return absmax < FLT_MIN ? 0.f : absmax; }

// 8-bit codes as a code kind (storage_kinds.h's CodeKinds): one element's code (its byte; a
// signed state's is an int8's bits) and value, as the CUDA kernels and the CPU loops' scalar
// elements take them. A block that is not coded holds zero codes.
namespace {  // internal linkage, as FA_HD's: each instruction set's build keeps its own copy
struct Quant8 {
  static constexpr int kBits = 8;
  static constexpr int64_t kBlock = kQuantBlock;
  static constexpr bool kStochastic = true;  // with stochastic_rounding
  FA_HD float value(uint32_t code, float absmax, bool is_signed) {
    return is_signed ? dequantize_signed(static_cast<float>(static_cast<int8_t>(code)), absmax)
                     : dequantize_unsigned(static_cast<float>(code), absmax);
  }
  // inv = 1 / absmax of a coded block; random32: the element's ops::rounding_bits, or null to
  // round to nearest
  FA_HD uint32_t code(float x, float inv, bool is_signed, const uint32_t* random32) {
    const float r = random32 ? static_cast<float>(code_random15(*random32, is_signed)) : 0.f;
    const float c = is_signed ? (random32 ? quantize_signed_stochastic(x, inv, r) : quantize_signed(x, inv))
                              : (random32 ? quantize_unsigned_stochastic(x, inv, r) : quantize_unsigned(x, inv));
    return static_cast<uint32_t>(static_cast<int32_t>(c));
  }
  FA_HD bool coded(float absmax) { return codes_block(absmax); }
  FA_HD float stored(float absmax) { return stored_absmax(absmax); }
  FA_HD uint32_t zero_code(bool) { return 0u; }
};
}  // namespace

}  // namespace fused_amp::ops
