// The fused SGD step (ops/sgd.h) for every param dtype, master kind and state dtype, and the
// step counts' increment both optimizers run after their update.
#include "cuda/step.cuh"

namespace fused_amp::cuda {

namespace {

template <typename param_t, MasterKind kMasterKind, typename state_t>
struct SgdFunctor {
  ops::SgdHyper h;
  StepScalars s;

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t start, int64_t n) const {
    if (skip(s)) return;
    const bool has_buf = h.momentum != 0.0;
    // counted with momentum (the first step starts the buffer) and for stochastic rounding
    const float* const step_ptr = static_cast<const float*>(meta.ptr[kSgdStep][t]);
    const float step = step_ptr ? *step_ptr : 0.f;
    const ops::SgdCoeffs c = ops::sgd_coeffs(h, lr_of(s), has_buf && step == 0.f, grad_mult_of(s));
    const auto pa = param_access<param_t, kMasterKind>(meta, t, start, s.write_grads && c.inv_scale != 1.f);
    const StepRounding rounding = rounding_of(s, step + 1.f, start);
    const auto states = step_states<state_t, 1>(
        meta, t, start, {{has_buf ? kMomentumBuffer : -1}, {true}, {false}, !c.first_step}, kSgdAbsmax);
    for_each_step_ilp(n, pa.aligned(), states, rounding, [&](const IlpIndex& ix, float (&st)[1][kILP]) {
      float p[kILP], g[kILP];
      pa.load(p, g, ix);
      pa.store_unscaled_grad(g, c.inv_scale, ix);
#pragma unroll
      for (int j = 0; j < kILP; ++j) ops::sgd_update(p[j], g[j], st[0][j], c);
      pa.store(p, ix, rounding);
    });
  }
};

struct IncrementStepFunctor {
  const float* found_inf;

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t, int64_t) const {
    if (threadIdx.x != 0 || (found_inf && *found_inf != 0.f)) return;
    *static_cast<float*>(meta.ptr[0][t]) += 1.f;
  }
};

}  // namespace

void sgd(const StepKind& kind, const std::vector<TensorPtrs>& tensors, const ops::SgdHyper& h,
         const StepScalars& s, cudaStream_t stream) {
  launch_step<5, SgdFunctor>(kind, tensors, h, s, stream);
}

void increment_steps(const std::vector<TensorPtrs>& steps, const float* found_inf,
                     cudaStream_t stream) {
  multi_tensor_apply<1>(steps, IncrementStepFunctor{found_inf}, stream);
}

}  // namespace fused_amp::cuda
