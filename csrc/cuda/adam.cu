// The fused Adam/AdamW step (ops/adam.h) for every param dtype, master kind and state dtype
// (fp32, bf16, 8-bit).
#include "cuda/step.cuh"

namespace fused_amp::cuda {

namespace {

template <typename param_t, MasterKind kMasterKind, typename state_t>
struct AdamFunctor {
  ops::AdamHyper h;
  StepScalars s;

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t start, int64_t n) const {
    if (skip(s)) return;
    const float step = *static_cast<const float*>(meta.ptr[kAdamStep][t]) + 1.f;
    const ops::AdamCoeffs c = ops::adam_coeffs(h, lr_of(s), step, grad_mult_of(s));
    const auto pa = param_access<param_t, kMasterKind>(meta, t, start, s.write_grads && c.inv_scale != 1.f);
    const StepRounding rounding = rounding_of(s, step, start);
    // exp_avg signed, rounded with the low random bits; the second moments unsigned, with the high
    // ones (max_exp_avg_sq with exp_avg_sq's: equal fp32 values stay equal)
    const auto states = step_states<state_t, 3>(
        meta, t, start, {{kExpAvg, kExpAvgSq, c.amsgrad ? kMaxExpAvgSq : -1}, {true, false, false}, {false, true, true}, true},
        kAdamAbsmax);
    for_each_step_ilp(n, pa.aligned(), states, rounding, [&](const IlpIndex& ix, float (&st)[3][kILP]) {
      float p[kILP], g[kILP];
      pa.load(p, g, ix);
      pa.store_unscaled_grad(g, c.inv_scale, ix);
#pragma unroll
      for (int j = 0; j < kILP; ++j) ops::adam_update(p[j], g[j], st[0][j], st[1][j], st[2][j], c);
      pa.store(p, ix, rounding);
    });
  }
};

}  // namespace

void adam(const StepKind& kind, const std::vector<TensorPtrs>& tensors, const ops::AdamHyper& h,
          const StepScalars& s, cudaStream_t stream) {
  launch_step<7, AdamFunctor>(kind, tensors, h, s, stream);
}

}  // namespace fused_amp::cuda
