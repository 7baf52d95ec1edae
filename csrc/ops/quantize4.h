#pragma once
// 4-bit blockwise optimizer state (state_dtype=torch.uint4): the math of one element's code, in
// torchao.optim's AdamW4bit scheme (after Li et al., "Memory Efficient Optimizers with 4-bit
// States", 2023). A state tensor is cut into blocks of kQuant4Block elements in its memory order
// (the last block may be shorter); a block keeps one fp32 absmax, and each element a 4-bit code,
// two to a byte: element 2i in the high half of byte i, 2i + 1 in the low half (torchao's
// packing). A code's value is its map's entry times the absmax:
//   signed states (exp_avg, momentum_buffer): the dynamic map of 3 exponent bits,
//     torchao's create_dynamic_map(True, 3, 4): 0, +-0.0055, +-0.0325, ..., +-0.8875, and 1
//     (no -1: the map is torchao's, asymmetric);
//   unsigned states (exp_avg_sq, ...): 1/16, 2/16, ..., 1 (no 0: a second moment never reads 0,
//     which bounds each update, as in ops/quantize.h).
// x codes to the entry nearest to x * (1 / absmax) (torchao divides; the upper entry at a tie, as
// torchao's), always to nearest: the maps are not uniform, so stochastic rounding is left to
// 8-bit codes. A block
// whose absmax is below FLT_MIN is stored as absmax 0 and its zero code; one whose absmax is inf
// or NaN as absmax NaN, so that it reads back as NaN.
#include <cfloat>
#include <cstdint>

#include "ops/common.h"
#include "ops/rounding.h"

namespace fused_amp::ops {

constexpr int64_t kQuant4Block = 128;

// The maps' entries, as fp32 (torchao's lists, rounded to fp32 as its qmap tensors are).
#define FA_SIGNED4_MAP                                                                              \
  {-0x1.c66666p-1f, -0x1.533334p-1f, -0x1.cp-2f, -0x1.b33332p-3f, -0x1.3d70a4p-4f, -0x1.0a3d72p-5f, \
   -0x1.6872b0p-8f, 0.f, 0x1.6872b0p-8f, 0x1.0a3d72p-5f, 0x1.3d70a4p-4f, 0x1.b33332p-3f, 0x1.cp-2f,  \
   0x1.533334p-1f, 0x1.c66666p-1f, 1.f}
constexpr int kSigned4Zero = 7;  // the signed map's 0 (the unsigned map's lowest entry is code 0)

// The value of a code's entry, unscaled.
FA_HD float map4_entry(uint32_t code, bool is_signed) {
  const float signed_map[16] = FA_SIGNED4_MAP;
  return is_signed ? signed_map[code & 15u] : static_cast<float>((code & 15u) + 1u) * 0.0625f;
}

// The midpoint of entries c and c + 1: their fp32 sum halved (exactly).
FA_HD float map4_mid(uint32_t c, bool is_signed) {
  return (map4_entry(c, is_signed) + map4_entry(c + 1, is_signed)) * 0.5f;
}

// The unsigned map's code of unit, from t = unit * 32 (exact): unit reaches the midpoint
// (2c + 3) / 32 of entries c and c + 1 when the integer part k of t does, so the midpoints reached
// number (k - 1) / 2, rounded down, and at least 0 (at most 15: unit = x * (1 / absmax) is at most
// 1 + 2^-23, so k <= 32). I = int32_t, or a vector of them.
template <typename I>
FA_HD I unsigned4_code_of_whole(I k) {
  const I c = (k - 1) >> 1;
  return c & ~(c >> 31);  // max(c, 0), branch-free (lanes too)
}

// The code of unit = x * (1 / absmax): how many midpoints it reaches (a midpoint itself codes to
// the upper entry, as torchao's residual >= half a step does).
FA_HD uint32_t code4_of_unit(float unit, bool is_signed) {
  if (!is_signed) return static_cast<uint32_t>(unsigned4_code_of_whole(static_cast<int32_t>(unit * 32.f)));
  uint32_t code = 0;
  for (uint32_t c = 0; c < 15; ++c) code += unit >= map4_mid(c, true) ? 1u : 0u;
  return code;
}

FA_HD uint32_t zero_code4(bool is_signed) { return is_signed ? kSigned4Zero : 0u; }

// A block is coded when its absmax is finite and at least FLT_MIN (as 8-bit blocks are); the
// absmax it keeps: 0 below FLT_MIN, NaN for inf or NaN.
FA_HD bool codes4_block(float absmax) { return absmax >= FLT_MIN && absmax <= FLT_MAX; }
FA_HD float stored_absmax4(float absmax) {
  return absmax < FLT_MIN ? 0.f : (absmax <= FLT_MAX ? absmax : float_of(0x7fc00000u));
}

// The code of element i (of the tensor's memory order) from its byte, and a pair's byte.
FA_HD uint32_t nibble_of(uint8_t byte, int64_t i) { return (i & 1) ? byte & 15u : byte >> 4; }
FA_HD uint8_t byte_of(uint32_t even, uint32_t odd) { return static_cast<uint8_t>(even << 4 | odd); }

// 4-bit codes as a code kind (storage_kinds.h's CodeKinds), as ops::Quant8 is: element 2i's
// code in the high half of byte i (torchao's packing), always to nearest.
namespace {  // internal linkage, as FA_HD's: each instruction set's build keeps its own copy
struct Quant4 {
  static constexpr int kBits = 4;
  static constexpr int64_t kBlock = kQuant4Block;
  static constexpr bool kStochastic = false;
  FA_HD float value(uint32_t code, float absmax, bool is_signed) { return map4_entry(code, is_signed) * absmax; }
  FA_HD uint32_t code(float x, float inv, bool is_signed, const uint32_t*) {
    return code4_of_unit(x * inv, is_signed);
  }
  FA_HD bool coded(float absmax) { return codes4_block(absmax); }
  FA_HD float stored(float absmax) { return stored_absmax4(absmax); }
  FA_HD uint32_t zero_code(bool is_signed) { return zero_code4(is_signed); }
};
}  // namespace

}  // namespace fused_amp::ops
