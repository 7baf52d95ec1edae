// The fused Lion step (ops/lion.h) for every param dtype, master kind and state dtype.
#include "cuda/step.cuh"

namespace fused_amp::cuda {

namespace {

template <typename param_t, MasterKind kMasterKind, typename state_t>
struct LionFunctor {
  ops::LionHyper h;
  StepScalars s;

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t start, int64_t n) const {
    if (skip(s)) return;
    const float step = *static_cast<const float*>(meta.ptr[kLionStep][t]) + 1.f;
    const ops::LionCoeffs c = ops::lion_coeffs(h, lr_of(s), grad_mult_of(s));
    const auto pa = param_access<param_t, kMasterKind>(meta, t, start, s.write_grads && c.inv_scale != 1.f);
    const StepRounding rounding = rounding_of(s, step, start);
    state_t* m = list_at<state_t>(meta.ptr[kLionExpAvg][t], start);
    const bool aligned = pa.aligned() && is_aligned(m);
    for_each_ilp(n, aligned, [&](const IlpIndex& ix) {
      float p[kILP], g[kILP], mr[kILP];
      pa.load(p, g, ix);
      load_ilp(mr, m, ix);
      pa.store_unscaled_grad(g, c.inv_scale, ix);
#pragma unroll
      for (int j = 0; j < kILP; ++j) ops::lion_update(p[j], g[j], mr[j], c);
      pa.store(p, ix, rounding);
      uint32_t random[kILP];
      rounding.bits(random, ix);
      store_state(m, mr, random, rounding.stochastic, false, ix);
    });
  }
};

}  // namespace

void lion(const StepKind& kind, const std::vector<TensorPtrs>& tensors, const ops::LionHyper& h,
          const StepScalars& s, cudaStream_t stream) {
  launch_step<5, LionFunctor>(kind, tensors, h, s, stream);
}

}  // namespace fused_amp::cuda
