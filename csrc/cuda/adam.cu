// The fused Adam/AdamW step (ops/adam.h) for every param dtype, master kind and state dtype.
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
    state_t* m = list_at<state_t>(meta.ptr[kExpAvg][t], start);
    state_t* v = list_at<state_t>(meta.ptr[kExpAvgSq][t], start);
    state_t* vmax = c.amsgrad ? list_at<state_t>(meta.ptr[kMaxExpAvgSq][t], start) : nullptr;
    const bool aligned = pa.aligned() && is_aligned(m) && is_aligned(v) && (!vmax || is_aligned(vmax));
    for_each_ilp(n, aligned, [&](const IlpIndex& ix) {
      float p[kILP], g[kILP], mr[kILP], vr[kILP], vmr[kILP] = {};
      pa.load(p, g, ix);
      load_ilp(mr, m, ix);
      load_ilp(vr, v, ix);
      if (vmax) load_ilp(vmr, vmax, ix);
      pa.store_unscaled_grad(g, c.inv_scale, ix);
#pragma unroll
      for (int j = 0; j < kILP; ++j) ops::adam_update(p[j], g[j], mr[j], vr[j], vmr[j], c);
      pa.store(p, ix, rounding);
      uint32_t random[kILP];
      rounding.bits(random, ix);
      // max_exp_avg_sq rounds with exp_avg_sq's bits: equal fp32 values stay equal
      store_state(m, mr, random, rounding.stochastic, false, ix);
      store_state(v, vr, random, rounding.stochastic, true, ix);
      if (vmax) store_state(vmax, vmr, random, rounding.stochastic, true, ix);
    });
  }
};

}  // namespace

void adam(const StepKind& kind, const std::vector<TensorPtrs>& tensors, const ops::AdamHyper& h,
          const StepScalars& s, cudaStream_t stream) {
  launch_step<7, AdamFunctor>(kind, tensors, h, s, stream);
}

}  // namespace fused_amp::cuda
