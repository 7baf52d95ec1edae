#pragma once
// The optimizer state of a chunk, as the step kernels see it: up to kStates fp32 values per
// element, loaded before the math and stored after it. Two families of state kinds
// (cuda/storage_traits.cuh) behind one loop, `for_each_step_ilp(n, aligned, states, rounding,
// body)`, where body(ix, st) does the math of the kILP elements at ix on st[state][j]:
// - element-wise tensors (Fp32State, BF16State): each element loaded and stored by its kind;
// - blockwise codes (Codes<Q>, one per code kind): the threads of a block
//   step tiles of TileShape::kThreads * kILP elements, whole quant blocks each; a quant block's new
//   absmax is a reduction over the threads that hold its elements, then each thread codes its
//   own. A thread's elements are contiguous (never strided across quant blocks), and chunks are
//   whole quant blocks, so no quant block spans two blocks of a launch: no atomics, and the bits
//   are those of the CPU loops (cpu/quantized_state.h) for any launch plan.
#include <type_traits>

#include "cuda/storage_traits.cuh"

namespace fused_amp::cuda {

// What a step kernel passes for its states: the lists that hold them (-1: absent), whether the
// state's map is signed (8-bit) and which half of the random bits rounds it (bf16), and whether
// the step reads the old values at all (SGD's first step does not).
template <int kStates>
struct StateSpec {
  int list[kStates];
  bool is_signed[kStates];
  bool high_bits[kStates];
  bool read;
};

// Whether every present (non-null) pointer allows the vector loads.
template <typename T, int kStates>
FA_DEVICE bool all_aligned(T* const (&p)[kStates]) {
#pragma unroll
  for (int k = 0; k < kStates; ++k) {
    if (p[k] && !is_aligned(p[k])) return false;
  }
  return true;
}

// Element-wise state (Fp32State, BF16State): the chunk's tensors of each state.
template <typename state_t, int kStates>
struct ElementStates {
  typename state_t::Elem* p[kStates];  // null: absent
  bool high_bits[kStates];
  bool read;

  FA_DEVICE bool aligned() const { return all_aligned(p); }
  FA_DEVICE void load(float (&st)[kStates][kILP], const IlpIndex& ix) const {
#pragma unroll
    for (int k = 0; k < kStates; ++k) {
      if (p[k] && read) {
        load_ilp(st[k], p[k], ix);
      } else {
#pragma unroll
        for (int j = 0; j < kILP; ++j) st[k][j] = 0.f;
      }
    }
  }
  FA_DEVICE void store(const float (&st)[kStates][kILP], const IlpIndex& ix, const StepRounding& rounding) const {
    uint32_t random[kILP];
    const bool stochastic = state_t::kRandom && rounding.stochastic;
    if (stochastic) rounding.bits(random, ix);
#pragma unroll
    for (int k = 0; k < kStates; ++k) {
      if (p[k]) state_t::store(p[k], st[k], ix, stochastic ? random : nullptr, high_bits[k]);
    }
  }
};

// Codes: the chunk's codes of each state (from the chunk's first element) and the absmax of its
// first quant block (one row per state after another in the absmax list: row r of a tensor of
// numel elements starts at r * its blocks).
template <class Codes, int kStates>
struct CodeStates {
  uint8_t* codes[kStates];  // null: absent
  float* absmax[kStates];
  bool is_signed[kStates];
  bool read;

  FA_DEVICE bool aligned() const { return all_aligned(codes); }
  FA_DEVICE void load(float (&st)[kStates][kILP], const IlpIndex& ix) const {
#pragma unroll
    for (int k = 0; k < kStates; ++k) {
      if (codes[k] && read && ix.base < ix.n) {
        Codes::values(st[k], codes[k], ix, absmax[k][ix.base / Codes::kBlock], is_signed[k]);
      } else {
#pragma unroll
        for (int j = 0; j < kILP; ++j) st[k][j] = 0.f;
      }
    }
  }
  // The codes of a thread's elements, given their quant block's new absmax.
  FA_DEVICE void store_codes(int k, const float (&x)[kILP], float block_absmax, const IlpIndex& ix,
                             const StepRounding& rounding) const {
    Codes::store(codes[k], x, block_absmax, ix, is_signed[k], rounding);
    if (ix.base % Codes::kBlock == 0) absmax[k][ix.base / Codes::kBlock] = Codes::stored_absmax(block_absmax);
  }
};
// The states of a chunk, as the state kind holds them.
template <typename state_t, int kStates>
struct StepStates
    : std::conditional_t<kCodes<state_t>, CodeStates<state_t, kStates>, ElementStates<state_t, kStates>> {};

template <typename state_t, int kStates, class Meta>
FA_DEVICE StepStates<state_t, kStates> step_states(const Meta& meta, int t, int64_t start,
                                                   const StateSpec<kStates>& spec, int absmax_list) {
  StepStates<state_t, kStates> s{};
  s.read = spec.read;
#pragma unroll
  for (int k = 0; k < kStates; ++k) {
    const void* list = spec.list[k] < 0 ? nullptr : meta.ptr[spec.list[k]][t];
    if constexpr (kCodes<state_t>) {
      constexpr int64_t kBlock = state_t::kBlock;
      s.codes[k] = list_at<uint8_t>(list, start * state_t::kBits / 8);  // (start: a block's first)
      s.is_signed[k] = spec.is_signed[k];
      // the states present take absmax rows 0, 1, ... in list order
      int row = 0;
      for (int i = 0; i < k; ++i) row += spec.list[i] >= 0;
      s.absmax[k] = list_at<float>(meta.ptr[absmax_list][t],
                                   row * ((meta.numel[t] + kBlock - 1) / kBlock) + start / kBlock);
    } else {
      s.p[k] = list_at<typename state_t::Elem>(list, start);
      s.high_bits[k] = spec.high_bits[k];
    }
  }
  return s;
}

// The largest |x| of a thread's elements; NaN when one is NaN (combine keeps a NaN from either side).
FA_DEVICE float absmax_combine(float a, float b) { return a != a || a > b ? a : b; }
FA_DEVICE float thread_absmax(const float (&x)[kILP], const IlpIndex& ix) {
  float m = 0.f;
#pragma unroll
  for (int j = 0; j < kILP; ++j) {
    if (ix.base + j < ix.n) m = absmax_combine(m, ops::abs_(x[j]));
  }
  return m;
}
// A block's absmax as the CPU loops compute it: NaN is the one quiet NaN, whatever the payload.
FA_DEVICE float canonical_absmax(float a) { return a != a ? ops::float_of(0x7fc00000u) : a; }

// A tile's kILP elements of thread `thread`: contiguous, vector loads where aligned and whole.
FA_DEVICE IlpIndex tile_index(int64_t tile, int thread, int64_t n, bool aligned) {
  const int64_t base = tile + static_cast<int64_t>(thread) * kILP;
  return IlpIndex{base, 1, n, aligned && base + kILP <= n};
}

template <class Codes>
constexpr int kThreadsPerQuantBlock = static_cast<int>(Codes::kBlock / kILP);

// Calls body(ix, st) for this thread's elements of every tile of the chunk's n elements, with
// the states loaded before and stored after. With 8-bit codes every thread of the block runs
// every tile (the absmax is a block-wide step).
template <typename state_t, int kStates, class Body>
FA_DEVICE void for_each_step_ilp(int64_t n, bool aligned, const StepStates<state_t, kStates>& states,
                                 const StepRounding& rounding, Body&& body) {
  if constexpr (!kCodes<state_t>) {
    for_each_ilp(n, aligned && states.aligned(), [&](const IlpIndex& ix) {
      float st[kStates][kILP];
      states.load(st, ix);
      body(ix, st);
      states.store(st, ix, rounding);
    });
  } else {
    constexpr int64_t kTile = TileShape::kThreads * kILP;
    const bool vec = aligned && states.aligned();
    // each warp's absmax per state, by tile parity: a tile's writes never meet the reads of the
    // tile before, so one barrier per tile suffices
    constexpr int kWarps = TileShape::kThreads / 32, kWarpsPerQuantBlock = kThreadsPerQuantBlock<state_t> / 32;
    static_assert(kThreadsPerQuantBlock<state_t> % 32 == 0, "a quant block is whole warps");
    static_assert(TileShape::kThreads % kThreadsPerQuantBlock<state_t> == 0 && TileShape::kChunk % state_t::kBlock == 0,
                  "tiles and chunks hold whole quant blocks");
    FA_SHARED(warp_absmax, float[2][kStates][kWarps]);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int parity = 0;
    for (int64_t tile = 0; tile < n; tile += kTile, parity ^= 1) {
      const IlpIndex ix = tile_index(tile, threadIdx.x, n, vec);
      float st[kStates][kILP];
      states.load(st, ix);
      if (ix.base < n) body(ix, st);
#pragma unroll
      for (int k = 0; k < kStates; ++k) {
        float m = thread_absmax(st[k], ix);
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) m = absmax_combine(m, __shfl_xor_sync(0xffffffffu, m, d));
        if (lane == 0) warp_absmax[parity][k][warp] = m;
      }
      __syncthreads();
      if (ix.base >= n) continue;
      const int first = warp - warp % kWarpsPerQuantBlock;
#pragma unroll
      for (int k = 0; k < kStates; ++k) {
        if (!states.codes[k]) continue;
        float a = warp_absmax[parity][k][first];
        for (int w = 1; w < kWarpsPerQuantBlock; ++w) a = absmax_combine(a, warp_absmax[parity][k][first + w]);
        states.store_codes(k, st[k], canonical_absmax(a), ix, rounding);
      }
    }
  }
}

}  // namespace fused_amp::cuda
