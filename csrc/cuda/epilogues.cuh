#pragma once
// The step's epilogues on CUDA: what it writes besides the params, each computed from a
// thread's kILP params as written (their fp32 values), right after they are stored, so that the
// kernels name none of them and every epilogue composes with every optimizer and storage kind.
// Each epilogue is one entry of Epilogues::run. The CPU's are cpu/epilogues.h: the same bits.
#include "cuda/multi_tensor_apply.cuh"
#include "ops/float8.h"

namespace fused_amp::cuda {

// The largest ops::magnitude_bits of the kILP values at ix that lie in the tensor.
FA_DEVICE uint32_t max_magnitude(const float (&w)[kILP], const IlpIndex& ix) {
  uint32_t m = 0;
#pragma unroll
  for (int j = 0; j < kILP; ++j) {
    const uint32_t b = ops::magnitude_bits(w[j]);
    if ((ix.packed || ix.base + j * ix.stride < ix.n) && b > m) m = b;
  }
  return m;
}

// A warp's largest `amax` into `slot` (every lane of the warp calls it).
FA_DEVICE void warp_max_into(uint32_t* slot, uint32_t amax) {
  for (int d = 16; d > 0; d >>= 1) {
    const uint32_t other = __shfl_xor_sync(0xffffffffu, amax, d);
    amax = other > amax ? other : amax;
  }
  if (threadIdx.x % 32 == 0) atomicMax(slot, amax);
}

// The cast factors of an MX copy's kILP elements at ix (ops/float8.h), each its block's; the
// block's e8m0 scale goes to `scales`. Contiguous elements (stride 1): a block is held by
// kMxBlock / kILP neighbouring lanes; strided by the block size: element j of each lane of a
// warp. Its lanes reduce the amax with shuffles. Chunks and tiles are whole blocks, so every lane
// of a block gets here, and no other lane needs to.
FA_DEVICE void mx_factors(const float (&w)[kILP], const IlpIndex& ix, uint8_t* scales, float (&factor)[kILP]) {
  constexpr int kBlockLanes = static_cast<int>(ops::kMxBlock / kILP);
  const int lane = threadIdx.x % 32;
  const auto reduce = [&](uint32_t amax, int lanes, unsigned group) {
    for (int d = 1; d < lanes; d <<= 1) {
      const uint32_t other = __shfl_xor_sync(group, amax, d);
      amax = other > amax ? other : amax;
    }
    return ops::e8m0_of_amax(amax);
  };
  if (ix.stride == 1) {
    const uint32_t code = reduce(max_magnitude(w, ix), kBlockLanes,
                                 ((1u << kBlockLanes) - 1u) << (lane / kBlockLanes * kBlockLanes));
    if (ix.base % ops::kMxBlock == 0) scales[ix.base / ops::kMxBlock] = static_cast<uint8_t>(code);
#pragma unroll
    for (int j = 0; j < kILP; ++j) factor[j] = ops::mx_cast_factor(code);
    return;
  }
#pragma unroll
  for (int j = 0; j < kILP; ++j) {
    const int64_t i = ix.base + j * ix.stride;
    if (i >= ix.n) continue;  // (the whole warp's: n is whole blocks)
    const uint32_t code = reduce(ops::magnitude_bits(w[j]), 32, 0xffffffffu);
    if (lane == 0) scales[i / ops::kMxBlock] = static_cast<uint8_t>(code);
    factor[j] = ops::mx_cast_factor(code);
  }
}

// The epilogues of one tensor's chunk, each asked for by its pointer (null where not).
struct Epilogues {
  uint32_t* amax_slot;  // the weight amax (fp8 scaling): the param's slot, maxed into per warp
  uint8_t* float8;      // an fp8 copy's e4m3 codes, of the params written times float8_scale
  float float8_scale;
  uint8_t* mx_scales;  // or, for an MX copy, by each block's e8m0 scale, written here
  uint32_t amax = 0;   // this thread's largest ops::magnitude_bits of the params written

  FA_DEVICE bool aligned() const { return !float8 || is_aligned(float8); }
  // Every epilogue asked for, over the params written at ix.
  FA_DEVICE void run(const float (&written)[kILP], const IlpIndex& ix) {
    if (amax_slot) {
      const uint32_t m = max_magnitude(written, ix);
      amax = m > amax ? m : amax;
    }
    if (float8) {
      float factor[kILP];
      if (mx_scales) {
        mx_factors(written, ix, mx_scales, factor);
      } else {
#pragma unroll
        for (int j = 0; j < kILP; ++j) factor[j] = float8_scale;
      }
      uint8_t codes[kILP];
#pragma unroll
      for (int j = 0; j < kILP; ++j) codes[j] = ops::e4m3_of_scaled(written[j], factor[j]);
      store_ilp(float8, codes, ix);
    }
  }
  // After the chunk: the reductions (every lane of the warp calls it).
  FA_DEVICE void finish() const {
    if (amax_slot) warp_max_into(amax_slot, amax);
  }
};

// Tensor t's epilogues from element `start` (launch.h's lists: the amax slot, then the fp8 copy,
// its scale and its MX scales).
template <class Meta>
FA_DEVICE Epilogues epilogues_of(const Meta& meta, int t, int64_t start, int amax_list, int float8_list) {
  const float* const float8_scale = static_cast<const float*>(meta.ptr[float8_list + 1][t]);
  uint8_t* const mx_scales =
      float8_scale ? nullptr : list_at<uint8_t>(meta.ptr[float8_list + 2][t], start / ops::kMxBlock);
  return {static_cast<uint32_t*>(meta.ptr[amax_list][t]), list_at<uint8_t>(meta.ptr[float8_list][t], start),
          float8_scale ? *float8_scale : 0.f, mx_scales};
}

}  // namespace fused_amp::cuda
