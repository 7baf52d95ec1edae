#pragma once
// What the optimizer kernel (optimizer_step.cu) is made of: one pass per step that reads each grad,
// updates the fp32 value of the param (master, param with remainder, or the param itself) and
// the state, and writes the param back rounded to its dtype.
#include "cuda/step_states.cuh"
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

// Everything the optimizers do around their math: pick the fp32 value of the param, write it
// back (and say the largest |param| written), leave the grad unscaled. Master is the param's
// master kind (cuda/storage_traits.h); the fp8 or MX copy is cast from the params written.
template <typename param_t, class Master>
struct ParamAccess {
  param_t* param;
  param_t* grad;
  void* master;     // Master::Elem*, null for InPlace
  bool write_grad;  // leave the grad as the step used it (unscaled, clipped), as torch's recipe does
  uint8_t* float8;  // the fp8 weight's e4m3 codes (ops/float8.h), of the params written times float8_scale
  float float8_scale;
  uint8_t* mx_scales;  // or, for an MX copy, by each block's e8m0 scale, written here

  FA_DEVICE bool aligned() const {
    return Master::aligned(param, master) && is_aligned(grad) && (!float8 || is_aligned(float8));
  }
  FA_DEVICE void load(float (&p)[kILP], float (&g)[kILP], const IlpIndex& ix) const {
    Master::load(p, param, master, ix);
    load_ilp(g, grad, ix);
  }
  FA_DEVICE void store_unscaled_grad(const float (&g)[kILP], float inv_scale, const IlpIndex& ix) const {
    if (!write_grad) return;
    float u[kILP];
#pragma unroll
    for (int j = 0; j < kILP; ++j) u[j] = g[j] * inv_scale;
    store_ilp(grad, u, ix);
  }
  // Stores the values; returns the largest ops::magnitude_bits of the params written (0 for an
  // output, which is not a param).
  FA_DEVICE uint32_t store(const float (&p)[kILP], const IlpIndex& ix, const StepRounding& rounding) const {
    float written[kILP];
    if (!Master::store(p, param, master, ix, rounding, written)) return 0;
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
    return max_magnitude(written, ix);
  }
};

// (float8: the fp8 weight's list, launch.h's float8_list)
template <typename param_t, class Master, class Meta>
FA_DEVICE ParamAccess<param_t, Master> param_access(const Meta& meta, int t, int64_t start, bool write_grad,
                                                    int float8) {
  const float* const float8_scale = static_cast<const float*>(meta.ptr[float8 + 1][t]);
  uint8_t* const mx_scales = float8_scale ? nullptr : list_at<uint8_t>(meta.ptr[float8 + 2][t], start / ops::kMxBlock);
  return {list_at<param_t>(meta.ptr[kParam][t], start), list_at<param_t>(meta.ptr[kGrad][t], start),
          list_at<typename Master::Elem>(meta.ptr[kMasterList][t], start), write_grad,
          list_at<uint8_t>(meta.ptr[float8][t], start), float8_scale ? *float8_scale : 0.f, mx_scales};
}

FA_DEVICE bool skip(const StepScalars& s) { return s.found_inf && *s.found_inf != 0.f; }
FA_DEVICE double lr_of(const StepScalars& s) { return s.lr_ptr ? *s.lr_ptr : s.lr; }
// What the grads are multiplied by: the scaler's 1/scale, times the clip coefficient.
FA_DEVICE float grad_mult_of(const StepScalars& s) {
  const float inv = s.inv_scale ? *s.inv_scale : 1.f;
  return s.grad_norm ? inv * ops::clip_coef(*s.grad_norm, s.max_grad_norm) : inv;
}
FA_DEVICE StepRounding rounding_of(const StepScalars& s, float step, int64_t start) {
  return {s.stochastic, s.stochastic_codes, s.stochastic ? ops::rounding_key(s.rounding_seed, step) : 0u, start};
}

// Calls launch.run<param_t, Master, state_t>() for the runtime param dtype and master kind.
template <typename state_t, class Launch>
void dispatch_param(Dtype dtype, MasterKind master, const Launch& launch) {
  const auto with_dtype = [&]<typename param_t>() {
    with_master_kind<param_t>(master, [&]<class Master>() { launch.template run<param_t, Master, state_t>(); });
  };
  switch (dtype) {
    case Dtype::Float: return with_dtype.template operator()<float>();
    case Dtype::Half: return with_dtype.template operator()<__half>();
    case Dtype::BFloat16: return with_dtype.template operator()<__nv_bfloat16>();
    case Dtype::Double: throw std::invalid_argument("fused_amp: float64 params are not supported");
  }
}

// The elementwise step's chunks: whole MX blocks, whose scale is a reduction within a chunk.
struct StepShape {
  static constexpr int64_t kChunk = ElementwiseShape::kChunk / ops::kMxBlock * ops::kMxBlock;
  static constexpr int kThreads = ElementwiseShape::kThreads;
};
static_assert(TileShape::kChunk % ops::kMxBlock == 0 && TileShape::kThreads % 32 == 0 &&
                  StepShape::kThreads % 32 == 0,
              "MX blocks lie within a chunk, and whole warps run a chunk");

// Runs f over tensors with kLists pointers each (launch.h's StepList, through the amax slot's) for
// state_t's storage kind: codes in tiles of whole quant blocks.
template <int kLists, typename state_t, class Functor>
void apply_step(const std::vector<TensorPtrs>& tensors, const Functor& f, cudaStream_t stream) {
  using Shape = std::conditional_t<kCodes<state_t>, TileShape, StepShape>;
  multi_tensor_apply<kLists, false, Shape>(tensors, f, stream);
}

// The launches of one state dtype, for the runtime param dtype and master kind.
template <class Launch>
struct ParamDispatch {
  const StepKind& kind;
  const Launch& launch;
  template <typename state_t>
  void run() const { dispatch_param<state_t>(kind.param, kind.master, launch); }
};

}  // namespace fused_amp::cuda
