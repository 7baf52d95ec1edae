#pragma once
// What the optimizer kernel (optimizer_step.cu) is made of: one pass per step that reads each grad,
// updates the fp32 value of the param (master, param with remainder, or the param itself) and
// the state, and writes the param back rounded to its dtype.
#include "cuda/epilogues.cuh"
#include "cuda/step_states.cuh"

namespace fused_amp::cuda {

// Everything the optimizers do around their math: pick the fp32 value of the param, write it
// back, leave the grad unscaled, and run the epilogues (cuda/epilogues.cuh) over the params
// written. Master is the param's master kind (cuda/storage_traits.cuh).
template <typename param_t, class Master>
struct ParamAccess {
  param_t* param;
  param_t* grad;
  void* master;     // Master::Elem*, null for InPlace
  bool write_grad;  // leave the grad as the step used it (unscaled, clipped), as torch's recipe does
  Epilogues epilogues;

  FA_DEVICE bool aligned() const {
    return Master::aligned(param, master) && is_aligned(grad) && epilogues.aligned();
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
  // Stores the values, then the epilogues of the params written (none for an output).
  FA_DEVICE void store(const float (&p)[kILP], const IlpIndex& ix, const StepRounding& rounding) {
    float written[kILP];
    if (Master::store(p, param, master, ix, rounding, written)) epilogues.run(written, ix);
  }
};

template <typename param_t, class Master, class Meta>
FA_DEVICE ParamAccess<param_t, Master> param_access(const Meta& meta, int t, int64_t start, bool write_grad,
                                                    int amax_list, int float8_list) {
  return {list_at<param_t>(meta.ptr[kParam][t], start), list_at<param_t>(meta.ptr[kGrad][t], start),
          list_at<typename Master::Elem>(meta.ptr[kMasterList][t], start), write_grad,
          epilogues_of(meta, t, start, amax_list, float8_list)};
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
