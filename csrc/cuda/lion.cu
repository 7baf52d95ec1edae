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
    const auto states = step_states<state_t, 1>(meta, t, start, {{kLionExpAvg}, {true}, {false}, true}, kLionAbsmax);
    for_each_step_ilp(n, pa.aligned(), states, rounding, [&](const IlpIndex& ix, float (&st)[1][kILP]) {
      float p[kILP], g[kILP];
      pa.load(p, g, ix);
      pa.store_unscaled_grad(g, c.inv_scale, ix);
#pragma unroll
      for (int j = 0; j < kILP; ++j) ops::lion_update(p[j], g[j], st[0][j], c);
      pa.store(p, ix, rounding);
    });
  }
};

}  // namespace

void lion(const StepKind& kind, const std::vector<TensorPtrs>& tensors, const ops::LionHyper& h,
          const StepScalars& s, cudaStream_t stream) {
  launch_step<5, LionFunctor>(kind, tensors, h, s, stream);
}

}  // namespace fused_amp::cuda
