#pragma once
// Ways to keep fp32 values in fewer bits:
// - an exact fp32 master as a bf16 param plus a 16-bit remainder (TransformerEngine's
//   store_param_remainders): the remainder is the master's low 16 bits, and the param is the
//   master rounded to nearest with ties away from zero, so that the pair gives the master back;
// - a 24-bit master (sign, 8 exponent bits, 15 stored mantissa bits: an fp32 value whose low 8
//   bits are zero) as a bf16 param plus one byte, the master's bits 8-15, joined the same way;
//   the step's fp32 result is rounded to 24 bits to nearest even, or stochastically;
// - bf16 optimizer state rounded stochastically, with random bits that depend on a seed, the step
//   and the element's index in its tensor only (no thread count, no device, no launch plan).
// The functions of bits that take a word type W compute on W = uint32_t (the scalar paths and
// CUDA) or on a GCC vector of uint32_t lanes (the CPU's vector loops, cpu/vec_bits.h's U32): the
// same operators on every lane (a comparison gives a lane mask, and ?: picks lane by lane), so
// that both paths compute the same bits from one spelling. W is named at the call, not deduced:
// 16-bit arguments widen to 32 bits before the shifts.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/common.h"

namespace fused_amp::ops {

FA_HD uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}

FA_HD float float_of(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

template <class W>
struct Word {
  using type = W;
};
template <class W>
using word_t = typename Word<W>::type;

// The signed type of W's lanes (a vector compare gives it). Magnitude bits are below 2^31, so a
// signed compare orders them as an unsigned one does, and it is one AVX2 instruction.
template <class W>
using signed_word_t = std::conditional_t<std::is_same_v<W, uint32_t>, int32_t, decltype(W{} > W{})>;

template <class W = uint32_t>
FA_HD auto is_nan_bits(word_t<W> b) { return (signed_word_t<W>)(b & 0x7fffffffu) > 0x7f800000; }

// |x| as bits: their unsigned order is the order of |x|, with NaN above inf, so that a maximum
// over them (a weight's amax for fp8 scaling) is NaN where any element is, as torch's is.
FA_HD uint32_t magnitude_bits(float x) { return bits_of(x) & 0x7fffffffu; }

// The bits of an fp32 value rounded to a bf16 value (low half zero) by adding `addend` (below
// 2^16) to its magnitude bits: the high half goes up exactly when the low half plus the addend
// carries. A NaN keeps its high half with the quiet bit set, so that it stays a NaN there. Both
// roundings below are this one with another addend.
template <class W = uint32_t>
FA_HD W round_bits_to_bf16(word_t<W> b, word_t<W> addend) {
  return (is_nan_bits<W>(b) ? b | 0x400000u : b + addend) & 0xffff0000u;
}

// The bf16 param of a master (its bits, in the low half): round to nearest, ties away from zero
// (half a bf16 ulp added).
template <class W = uint32_t>
FA_HD W param_bits_of_master(word_t<W> m) {
  return round_bits_to_bf16<W>(m, W{} + 0x8000u) >> 16;
}
FA_HD uint16_t remainder_of_master(uint32_t m) { return static_cast<uint16_t>(m & 0xffffu); }
// The master again: the param's bits, less the carry the rounding added, over the remainder.
// Exact for every master that is not NaN (a NaN master comes back as a NaN).
template <class W = uint32_t>
FA_HD W master_of(word_t<W> param, word_t<W> remainder) {
  return ((param - (remainder >> 15)) << 16) | remainder;
}

// ---- 24-bit masters: a bf16 param and a byte -------------------------------------------------

// The bits of an fp32 value rounded to a 24-bit one (low 8 bits zero) by adding `addend` (below
// 2^8) to its magnitude bits; a NaN stays a NaN (quiet). Beyond the largest 24-bit value the
// sum carries into the exponent's top: infinity, as IEEE rounding overflows.
template <class W = uint32_t>
FA_HD W round_bits_to_24(word_t<W> b, word_t<W> addend) {
  return (is_nan_bits<W>(b) ? b | 0x400000u : b + addend) & 0xffffff00u;
}
// The addend of rounding to nearest, ties to even (the kept bits' lowest bit decides a tie).
template <class W = uint32_t>
FA_HD W nearest_24_addend(word_t<W> b) { return 0x7fu + ((b >> 8) & 1u); }

// A 24-bit master's parts: the param as in the remainder's split, the byte its bits 8-15.
FA_HD uint8_t remainder8_of_master(uint32_t m24) { return static_cast<uint8_t>(m24 >> 8); }
// The 24-bit master again: the param less the carry of its rounding (the byte's top bit, the
// master's bit 15), over the byte. Exact for every 24-bit master that is not NaN.
template <class W = uint32_t>
FA_HD W master24_of(word_t<W> param, word_t<W> remainder8) {
  return ((param - (remainder8 >> 7)) << 16) | (remainder8 << 8);
}

// A 32-bit integer hash (Chris Wellons' lowbias32): every input bit changes about half the
// output bits, with two multiplies.
template <class W = uint32_t>
FA_HD W mix32(word_t<W> x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The key of one step of one optimizer: its seed and the (1-based) step count.
FA_HD uint32_t rounding_key(int64_t seed, float step) {
  const uint64_t s = static_cast<uint64_t>(seed);
  return mix32(static_cast<uint32_t>(s) ^ mix32(static_cast<uint32_t>(s >> 32) ^
                                               mix32(static_cast<uint32_t>(step))));
}

// 32 random bits for the element at `index`: the low 16 round the first state (exp_avg, the
// momentum buffer), the high 16 the second (exp_avg_sq, and max_exp_avg_sq with the same bits,
// so that equal fp32 values stay equal in bf16).
FA_HD uint32_t rounding_bits(uint32_t key, int64_t index) {
  return mix32(key ^ static_cast<uint32_t>(index));
}

// The key of the random bits that round 24-bit masters, from a step's key: other bits than the
// state's (rounding_bits(master_rounding_key(key), index), low 8 bits), so that the rounding of
// a master and of its moments are independent.
FA_HD uint32_t master_rounding_key(uint32_t key) { return mix32(key ^ 0x9e3779b9u); }

// x rounded to a bf16 value stochastically: up in magnitude with probability (low 16 bits of x)
// / 2^16, given 16 uniform random bits. The result is exact in bf16 (its low half is zero).
FA_HD float stochastic_round_bf16(float x, uint32_t random16) {
  return float_of(round_bits_to_bf16(bits_of(x), random16));
}

}  // namespace fused_amp::ops
