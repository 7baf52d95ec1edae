#pragma once
// The storage kinds of storage_kinds.h as the step kernels see them: each kind one struct that
// says how a thread's kILP elements at ix load, store, round and align. The kernels
// (cuda/step.cuh's ParamAccess, cuda/step_states.cuh's loops) call only these, and pick them
// with with_master_kind and with_state_kind below; no branch on a kind stands outside this file.
// The kinds' bits are ops/rounding.h's (masters, bf16 state), ops/quantize.h's and
// ops/quantize4.h's (codes), the same functions the CPU loops call (cpu/storage_traits.h).
#include <stdexcept>
#include <type_traits>

#include "cuda/multi_tensor_apply.cuh"
#include "ops/rounding.h"
#include "storage_kinds.h"

namespace fused_amp::cuda {

// How a step rounds what it stores in fewer than 32 bits (bf16 state, 24-bit masters, and 8-bit
// codes where `codes` says so): to nearest even, or stochastically with the random bits of
// (key, element index) (ops/rounding.h). `start` is the chunk's first element in its tensor.
struct StepRounding {
  bool stochastic;
  bool codes;
  uint32_t key;
  int64_t start;

  // The random bits of the kILP elements at ix: [j] for element j, of `key` (the state's) or of
  // ops::master_rounding_key(key) (the 24-bit masters').
  FA_DEVICE void bits(uint32_t (&r)[kILP], const IlpIndex& ix, bool master = false) const {
    const uint32_t k = master ? ops::master_rounding_key(key) : key;
#pragma unroll
    for (int j = 0; j < kILP; ++j) {
      r[j] = stochastic ? ops::rounding_bits(k, start + ix.base + (ix.packed ? j : j * ix.stride)) : 0u;
    }
  }
};

// ---- masters -------------------------------------------------------------------------------
// Each master kind of params of dtype param_t: Elem (its tensor's element; the master list's
// pointer is cast to Elem*), aligned (the param and the master allow vector access), load (the
// fp32 values of the kILP params at ix) and store (the values as the param and its master;
// `written` gets the params written as fp32, and it returns false when what it wrote is no
// param). kHolds<param_t>: the param dtypes the kind is defined for.

// MasterKind::None: the param is its own fp32 value.
struct InPlace {
  using Elem = float;  // (no tensor: the pointer is null)
  template <typename param_t>
  static constexpr bool kHolds = true;
  template <typename param_t>
  FA_DEVICE static bool aligned(const param_t* param, const void*) { return is_aligned(param); }
  template <typename param_t>
  FA_DEVICE static void load(float (&p)[kILP], const param_t* param, const void*, const IlpIndex& ix) {
    load_ilp(p, param, ix);
  }
  template <typename param_t>
  FA_DEVICE static bool store(const float (&p)[kILP], param_t* param, void*, const IlpIndex& ix, const StepRounding&,
                              float (&written)[kILP]) {
    store_ilp(param, p, ix);
#pragma unroll
    for (int j = 0; j < kILP; ++j) written[j] = widen(from_float<param_t>(p[j]));
    return true;
  }
};

// MasterKind::Fp32: an fp32 master; the param is its rounding to nearest even.
struct Fp32Master {
  using Elem = float;
  template <typename param_t>
  static constexpr bool kHolds = !std::is_same_v<param_t, float>;
  template <typename param_t>
  FA_DEVICE static bool aligned(const param_t* param, const void* master) {
    return is_aligned(param) && is_aligned(static_cast<const Elem*>(master));
  }
  template <typename param_t>
  FA_DEVICE static void load(float (&p)[kILP], const param_t*, const void* master, const IlpIndex& ix) {
    load_ilp(p, static_cast<const Elem*>(master), ix);
  }
  template <typename param_t>
  FA_DEVICE static bool store(const float (&p)[kILP], param_t* param, void* master, const IlpIndex& ix,
                              const StepRounding& rounding, float (&written)[kILP]) {
    store_ilp(static_cast<Elem*>(master), p, ix);
    return InPlace::store(p, param, nullptr, ix, rounding, written);
  }
};

// The bf16 params of these bits, as fp32.
FA_DEVICE void widen_bits(const uint16_t (&hi)[kILP], float (&w)[kILP]) {
#pragma unroll
  for (int j = 0; j < kILP; ++j) w[j] = ops::float_of(static_cast<uint32_t>(hi[j]) << 16);
}
FA_DEVICE uint16_t* bits_of_params(__nv_bfloat16* param) { return reinterpret_cast<uint16_t*>(param); }
FA_DEVICE const uint16_t* bits_of_params(const __nv_bfloat16* param) {
  return reinterpret_cast<const uint16_t*>(param);
}

// The two remainder kinds: a master as the bf16 param (its high half) and a low part Lo (16
// bits, or a 24-bit master's byte), loaded and stored together; each kind joins and splits them.
template <typename Lo>
struct BF16Halves {
  using Elem = Lo;
  template <typename param_t>
  static constexpr bool kHolds = std::is_same_v<param_t, __nv_bfloat16>;
  FA_DEVICE static bool aligned(const __nv_bfloat16* param, const void* master) {
    return is_aligned(param) && is_aligned(static_cast<const Lo*>(master));
  }
  FA_DEVICE static void load_halves(uint16_t (&hi)[kILP], Lo (&lo)[kILP], const __nv_bfloat16* param,
                                    const void* master, const IlpIndex& ix) {
    load_ilp(hi, bits_of_params(param), ix);
    load_ilp(lo, static_cast<const Lo*>(master), ix);
  }
  // (written: the params stored, as fp32)
  FA_DEVICE static void store_halves(const uint16_t (&hi)[kILP], const Lo (&lo)[kILP], __nv_bfloat16* param,
                                     void* master, const IlpIndex& ix, float (&written)[kILP]) {
    store_ilp(bits_of_params(param), hi, ix);
    store_ilp(static_cast<Lo*>(master), lo, ix);
    widen_bits(hi, written);
  }
};

// MasterKind::Remainder: an exact fp32 master as the bf16 param and its low 16 bits.
struct Remainder16 : BF16Halves<uint16_t> {
  FA_DEVICE static void load(float (&p)[kILP], const __nv_bfloat16* param, const void* master, const IlpIndex& ix) {
    uint16_t hi[kILP], lo[kILP];
    load_halves(hi, lo, param, master, ix);
#pragma unroll
    for (int j = 0; j < kILP; ++j) p[j] = ops::float_of(ops::master_of(hi[j], lo[j]));
  }
  FA_DEVICE static bool store(const float (&p)[kILP], __nv_bfloat16* param, void* master, const IlpIndex& ix,
                              const StepRounding&, float (&written)[kILP]) {
    uint16_t hi[kILP], lo[kILP];
#pragma unroll
    for (int j = 0; j < kILP; ++j) {
      hi[j] = ops::param_bits_of_master(ops::bits_of(p[j]));
      lo[j] = ops::remainder_of_master(ops::bits_of(p[j]));
    }
    store_halves(hi, lo, param, master, ix, written);
    return true;
  }
};

// MasterKind::Remainder8: a 24-bit master as the bf16 param and a byte; the step's fp32 value
// rounds to 24 bits to nearest even, or stochastically (8 random bits per element, of
// ops::master_rounding_key). The param is rounded from the 24-bit value.
struct Remainder24 : BF16Halves<uint8_t> {
  FA_DEVICE static void load(float (&p)[kILP], const __nv_bfloat16* param, const void* master, const IlpIndex& ix) {
    uint16_t hi[kILP];
    uint8_t lo[kILP];
    load_halves(hi, lo, param, master, ix);
#pragma unroll
    for (int j = 0; j < kILP; ++j) p[j] = ops::float_of(ops::master24_of(hi[j], lo[j]));
  }
  FA_DEVICE static bool store(const float (&p)[kILP], __nv_bfloat16* param, void* master, const IlpIndex& ix,
                              const StepRounding& rounding, float (&written)[kILP]) {
    uint32_t random[kILP];
    rounding.bits(random, ix, true);
    uint16_t hi[kILP];
    uint8_t lo[kILP];
#pragma unroll
    for (int j = 0; j < kILP; ++j) {
      const uint32_t b = ops::bits_of(p[j]);
      const uint32_t m = ops::round_bits_to_24(b, rounding.stochastic ? random[j] & 0xffu : ops::nearest_24_addend(b));
      hi[j] = ops::param_bits_of_master(m);
      lo[j] = ops::remainder8_of_master(m);
    }
    store_halves(hi, lo, param, master, ix, written);
    return true;
  }
};

// No master: an optimizer that writes no param (ops::Elementwise::kWritesOutput) writes its bf16
// output, rounded to nearest even as torch's .bfloat16(), where the master would be.
struct Output {
  using Elem = __nv_bfloat16;
  template <typename param_t>
  static constexpr bool kHolds = true;
  template <typename param_t>
  FA_DEVICE static bool aligned(const param_t*, const void* master) {
    return is_aligned(static_cast<const Elem*>(master));
  }
  template <typename param_t>
  FA_DEVICE static void load(float (&p)[kILP], const param_t*, const void*, const IlpIndex&) {
#pragma unroll
    for (int j = 0; j < kILP; ++j) p[j] = 0.f;
  }
  template <typename param_t>
  FA_DEVICE static bool store(const float (&p)[kILP], param_t*, void* master, const IlpIndex& ix, const StepRounding&,
                              float (&)[kILP]) {
    store_ilp(static_cast<Elem*>(master), p, ix);
    return false;
  }
};

// Calls f.template operator()<Kind>() with the struct of the host's master kind, for params of
// dtype param_t (validation refuses the kinds a dtype cannot have before any launch).
template <typename param_t, class F>
void with_master_kind(MasterKind kind, const F& f) {
  const auto run = [&]<class Kind>() {
    if constexpr (Kind::template kHolds<param_t>) {
      f.template operator()<Kind>();
    } else {
      throw std::invalid_argument("fused_amp: a master kind its param dtype cannot have");
    }
  };
  switch (kind) {
    case MasterKind::None: return run.template operator()<InPlace>();
    case MasterKind::Fp32: return run.template operator()<Fp32Master>();
    case MasterKind::Remainder: return run.template operator()<Remainder16>();
    case MasterKind::Remainder8: return run.template operator()<Remainder24>();
    case MasterKind::Output: throw std::invalid_argument("fused_amp: the host passes no Output master kind");
  }
}

// ---- state -----------------------------------------------------------------------------------
// Element-wise state: Elem (its tensor's element) and store (the kILP fp32 values at ix; with
// `random`, the elements' random bits, null when rounding to nearest, bf16 rounds
// stochastically with their low or high 16 bits: max_exp_avg_sq with exp_avg_sq's, so that
// equal fp32 values stay equal). kBlock 0: no blocks.

// StateKind::Fp32.
struct Fp32State {
  using Elem = float;
  static constexpr int64_t kBlock = 0;
  static constexpr bool kRandom = false;
  FA_DEVICE static void store(Elem* p, const float (&st)[kILP], const IlpIndex& ix, const uint32_t*, bool) {
    store_ilp(p, st, ix);
  }
};

// StateKind::BFloat16: to nearest even (torch's conversion), or stochastically.
struct BF16State {
  using Elem = __nv_bfloat16;
  static constexpr int64_t kBlock = 0;
  static constexpr bool kRandom = true;
  FA_DEVICE static void store(Elem* p, const float (&st)[kILP], const IlpIndex& ix, const uint32_t* random,
                              bool high_bits) {
    if (!random) return store_ilp(p, st, ix);
    float r[kILP];
#pragma unroll
    for (int j = 0; j < kILP; ++j) r[j] = ops::stochastic_round_bf16(st[j], high_bits ? random[j] >> 16 : random[j] & 0xffffu);
    store_ilp(p, r, ix);  // exact: the values are bf16 values already
  }
};

// A code kind (the math Q of storage_kinds.h's CodeKindList), as a thread reads and writes the
// codes of its kILP contiguous elements (which lie in one quant block: ix.base is a multiple of
// kILP). Their values are those of the CPU loops (cpu/quantized_state.h): the same products, the
// same rounding. Codes of fewer than 8 bits lie 8 / kBits to a byte, the first in the high bits
// (torchao's packing of 4-bit codes).
template <class Q>
struct Codes {
  static constexpr int64_t kBlock = Q::kBlock;
  static constexpr int kBits = Q::kBits, kPerByte = 8 / kBits;
  static_assert(kILP % kPerByte == 0, "a thread's elements are whole bytes of codes");
  FA_DEVICE static void values(float (&v)[kILP], const uint8_t* codes, const IlpIndex& ix, float absmax,
                               bool is_signed) {
    if constexpr (kBits == 8) {
      uint8_t c[kILP];
      load_ilp(c, codes, ix);
#pragma unroll
      for (int j = 0; j < kILP; ++j) v[j] = Q::value(c[j], absmax, is_signed);
    } else {
#pragma unroll
      for (int j = 0; j < kILP; ++j) {
        const int64_t i = ix.base + j;
        if (i >= ix.n) {  // (past the end: no byte to read)
          v[j] = 0.f;
          continue;
        }
        const uint32_t c = codes[i / kPerByte] >> (8 - kBits * (1 + i % kPerByte)) & ((1u << kBits) - 1u);
        v[j] = Q::value(c, absmax, is_signed);
      }
    }
  }
  FA_DEVICE static void store(uint8_t* codes, const float (&x)[kILP], float block_absmax, const IlpIndex& ix,
                              bool is_signed, const StepRounding& rounding) {
    uint32_t c[kILP];
    const bool coded = Q::coded(block_absmax);
    const float inv = coded ? 1.f / block_absmax : 0.f;
    const bool stochastic = Q::kStochastic && rounding.stochastic && rounding.codes;
    uint32_t random[kILP] = {};
    if (stochastic) rounding.bits(random, ix);  // (24-bit masters may round stochastically alone)
#pragma unroll
    for (int j = 0; j < kILP; ++j) {
      c[j] = coded ? Q::code(x[j], inv, is_signed, stochastic ? &random[j] : nullptr) : Q::zero_code(is_signed);
    }
    if constexpr (kBits == 8) {
      uint8_t bytes[kILP];
#pragma unroll
      for (int j = 0; j < kILP; ++j) bytes[j] = static_cast<uint8_t>(c[j]);  // an int8 code's bits
      store_ilp(codes, bytes, ix);
    } else {
#pragma unroll
      for (int j = 0; j < kILP; j += kPerByte) {
        const int64_t i = ix.base + j;
        if (i >= ix.n) continue;
        uint32_t byte = 0;
#pragma unroll
        for (int q = 0; q < kPerByte; ++q) byte = byte << kBits | (i + q < ix.n ? c[j + q] : 0u);
        codes[i / kPerByte] = static_cast<uint8_t>(byte);
      }
    }
  }
  FA_DEVICE static float stored_absmax(float a) { return Q::stored(a); }
};

// Whether a state kind holds codes in blocks (the tiles of step_states.cuh), as the table says.
template <typename state_t>
constexpr bool kCodes = state_t::kBlock > 0;

// Calls f.template run<state_t>() with the struct of the host's state kind: the element-wise
// kinds, then the code kinds in CodeKindList's order.
template <class F, class... Q>
void with_code_kind(int kind, const F& f, CodeKinds<Q...>) {
  int i = kFirstCodeKind;
  (void)((kind == i++ ? (f.template run<Codes<Q>>(), true) : false) || ...);
}
template <class F>
void with_state_kind(StateKind kind, const F& f) {
  switch (kind) {
    case StateKind::Fp32: return f.template run<Fp32State>();
    case StateKind::BFloat16: return f.template run<BF16State>();
    default: return with_code_kind(static_cast<int>(kind), f, CodeKindList{});
  }
}

}  // namespace fused_amp::cuda
