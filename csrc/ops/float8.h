#pragma once
// fp8 e4m3 weights (torch.float8_e4m3fn: 4 exponent bits of bias 7, 3 mantissa bits, no
// infinities, largest value 448), cast as torchao casts a weight (x.float() * scale, clamped to
// +-448, then torch's conversion: to nearest even, NaN stays NaN) and as TransformerEngine's
// saturating cast does. Generic over the word type W, as ops/rounding.h's bit functions are.
#include "ops/rounding.h"

namespace fused_amp::ops {

constexpr uint32_t kE4m3MaxBits = 0x43e00000u;        // 448.0f
constexpr uint32_t kE4m3MinNormalBits = 121u << 23;   // 2^-6
constexpr float kE4m3SubnormalBias = 16384.f;         // 2^14: its fp32 ulp is 2^-9, e4m3's subnormal step
constexpr uint32_t kE4m3SubnormalBiasBits = 0x46800000u;

// |b| saturated to 448 (a NaN kept): the magnitude the cast rounds.
template <class W = uint32_t>
FA_HD W e4m3_magnitude(word_t<W> b) {
  const W mag = b & 0x7fffffffu;
  return (is_nan_bits<W>(mag) || mag <= W{} + kE4m3MaxBits) ? mag : W{} + kE4m3MaxBits;
}

// The e4m3 code of fp32 bits `b`, from `mag` (e4m3_magnitude(b)) and `subnormal_sum`, the bits of
// the fp32 sum float_of(mag) + 2^14. That sum rounds mag to a multiple of 2^-9 to nearest even,
// so below 2^-6 its low bits are the subnormal code (8, the smallest normal, where it rounds up
// to 2^-6). Above, the mantissa rounds to 3 bits to nearest even and the exponent is rebiased
// from 127 to 7. A NaN gives 0x7f, with b's sign as every code.
template <class W = uint32_t>
FA_HD W e4m3_code(word_t<W> b, word_t<W> mag, word_t<W> subnormal_sum) {
  const W normal = (mag + 0x7ffffu + ((mag >> 20) & 1u) - (120u << 23)) >> 20;
  const W subnormal = subnormal_sum - kE4m3SubnormalBiasBits;
  const W code = is_nan_bits<W>(mag) ? W{} + 0x7fu : (mag < W{} + kE4m3MinNormalBits ? subnormal : normal);
  return code | ((b >> 24) & 0x80u);
}

// The e4m3 code of x * scale.
FA_HD uint8_t e4m3_of_scaled(float x, float scale) {
  const uint32_t b = bits_of(x * scale);
  const uint32_t mag = e4m3_magnitude(b);
  return static_cast<uint8_t>(e4m3_code(b, mag, bits_of(float_of(mag) + kE4m3SubnormalBias)));
}

// MX blocks (OCP microscaling's MXFP8, as torchao's to_mx casts a weight in its default FLOOR
// mode): each run of kMxBlock elements along the last dim shares one e8m0 scale, the power of
// two 2^(e - 127) stored as its biased exponent e. e is the block's amax's exponent less 8
// (e4m3's largest power of two), at least 0; 255 (NaN) for a NaN amax. The block is divided by
// that scale, but by 2^-126 where e is 0 (torchao clamps the scale to fp32's smallest normal),
// then cast as above.
constexpr int64_t kMxBlock = 32;

// The e8m0 code of a block whose largest magnitude_bits are `amax` (above inf: a NaN).
FA_HD uint32_t e8m0_of_amax(uint32_t amax) {
  const uint32_t exponent = amax >> 23;
  return amax > 0x7f800000u ? 255u : (exponent > 8u ? exponent - 8u : 0u);
}

// What a block of e8m0 code `e` is multiplied by before its cast: 1 / max(2^(e - 127), 2^-126), a
// power of two, so that the product is the quotient to the bit; 0 for NaN (x / inf).
FA_HD float mx_cast_factor(uint32_t e) { return e == 255u ? 0.f : float_of((254u - (e > 1u ? e : 1u)) << 23); }

}  // namespace fused_amp::ops
