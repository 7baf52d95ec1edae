#pragma once
// Inner loops over one contiguous range of elements, compiled once per CPU instruction set
// (loops_default.cpp, loops_avx2.cpp, loops_avx512.cpp) and picked at load time. They see raw
// pointers only: tensors, threads and validation stay in the generic code (cpu_ops.cpp).
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <array>
#include <cstdint>

#include "ops/float8.h"
#include "ops/grad_norm.h"
#include "storage_kinds.h"
#include "optimizers.h"

namespace fused_amp::cpu {

// The step's epilogues: what it writes besides the params, each from the params as written, and
// each asked for by its pointer (null where not). Pointers are offset to the range's start.
struct Epilogues {
  // the weight amax (fp8 scaling): the param's slot, into which each range maxes (atomically) the
  // ops::magnitude_bits of the largest |param| it wrote
  uint32_t* amax_bits = nullptr;
  // an fp8 copy: its e4m3 codes, the cast of the params written times float8_scale
  // (ops/float8.h), or with mx_scales each block's cast by its e8m0 scale, written there (one
  // per ops::kMxBlock elements from the range's first)
  uint8_t* float8 = nullptr;
  float float8_scale = 0.f;
  uint8_t* mx_scales = nullptr;
  bool any() const { return amax_bits || float8; }
  // the same from element b of the range (b starts an MX block where there are MX scales)
  Epilogues from(int64_t b) const {
    return {amax_bits, float8 ? float8 + b : nullptr, float8_scale, mx_scales ? mx_scales + b / ops::kMxBlock : nullptr};
  }
};

// Pointers are already offset to the range start, whose index in its tensor is `first`. The
// fp32 value of the param lives as `master_kind` says (storage_kinds.h): in `master`, an fp32
// master or the remainder that joins the bf16 param (16 bits, or 8 of a 24-bit master;
// ops/rounding.h), or in the param itself (MasterKind::None: fp32 params, or half params with
// master_weights=False; `master` null). `state[k]` is the
// optimizer's state k (ops/optimizer.h; null where not kept), fp32 or bf16 as the loop's state
// type says; bf16 state and 24-bit
// masters round to nearest even, or with `stochastic` by the random bits of `round_key`. With
// `write_grad` the grad is left unscaled (grad * inv_scale), as torch's fused steps leave it.
// 8-bit state (ops/quantize.h) holds codes in the state pointers and its blocks' absmax in
// `absmax`: the row of the k-th state kept starts at absmax + k * absmax_row_stride, at the block
// of element 0 of the tensor (`first` is then a multiple of ops::kQuantBlock).
template <typename param_t>
struct UpdateRange {
  param_t* param;
  param_t* grad;
  MasterKind master_kind;
  void* master;
  void* state[ops::kMaxStates];
  float* absmax;
  int64_t absmax_row_stride;
  int64_t n;
  int64_t first;
  uint32_t round_key;
  bool stochastic;        // bf16 state and 24-bit masters round stochastically with round_key
  bool stochastic_codes;  // so do 8-bit codes
  bool write_grad;
  // streaming stores of the param (see update_range); off for the short ranges of 8-bit state,
  // where the fence after each would stall every block
  bool may_stream = true;
  // an optimizer that writes no param (ops::Elementwise::kWritesOutput): its bf16 output
  c10::BFloat16* output = nullptr;
  // what the step writes besides the param, from the params it wrote (cpu/epilogues.h)
  Epilogues epilogues;
};

// The master's elements of r from i, as master_kind's type (a remainder's int16 as raw bf16 bits).
template <typename M, typename T>
inline M* master_at(const UpdateRange<T>& r, int64_t i) { return static_cast<M*>(r.master) + i; }


struct Loops {
  const char* isa;
  // Return true when some element is inf or NaN. With write == false only checks.
  bool (*unscale_float)(float*, int64_t, float, bool);
  bool (*unscale_double)(double*, int64_t, double, bool);
  bool (*unscale_half)(c10::Half*, int64_t, float, bool);
  bool (*unscale_bfloat16)(c10::BFloat16*, int64_t, float, bool);
  // The partial value of a norm over a range of elements times inv_scale (ops/grad_norm.h),
  // indexed by ops::NormKind: a sum of |x|, of x^2, or a maximum of |x|.
  double (*norm_float[3])(const float*, int64_t, float);
  double (*norm_double[3])(const double*, int64_t, float);
  double (*norm_half[3])(const c10::Half*, int64_t, float);
  double (*norm_bfloat16[3])(const c10::BFloat16*, int64_t, float);
  // The step loops of each optimizer (in the order of `Optimizers`), by param dtype and
  // StateKind; the coefficients are the optimizer's Coeffs.
  template <typename T>
  using ByStateKind = std::array<void (*)(const UpdateRange<T>&, const void* coeffs), kStateKindCount>;
  struct Step {
    ByStateKind<float> on_float;
    ByStateKind<c10::Half> on_half;
    ByStateKind<c10::BFloat16> on_bfloat16;
  };
  Step step[Optimizers::size];
};

namespace DEFAULT { const Loops& loops(); }
namespace AVX2 { const Loops& loops(); }
namespace AVX512 { const Loops& loops(); }

// The loops for the instruction set torch's own CPU kernels use (ATEN_CPU_CAPABILITY honoured).
const Loops& loops();

// Whether the AVX-512 loops store bf16 with AVX512-BF16's conversion (cpu/vec_bits.h's converted_bf16):
// where the CPU has it, unless FUSED_AMP_CPU_BF16=0 (the tests' way to run the other path).
extern const bool bf16_conversion;

}  // namespace fused_amp::cpu
