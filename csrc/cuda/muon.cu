// Muon's momentum pass (ops/muon.h) for every grad dtype and state dtype: reads each grad and
// momentum, writes the momentum, the bf16 Newton-Schulz input, and the grad unscaled.
#include "cuda/step.cuh"

namespace fused_amp::cuda {

namespace {

template <typename grad_t, typename state_t>
struct MuonFunctor {
  ops::MuonHyper h;
  StepScalars s;

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t start, int64_t n) const {
    if (skip(s)) return;
    const ops::MuonCoeffs c = ops::muon_coeffs(h, grad_mult_of(s));
    grad_t* grad = list_at<grad_t>(meta.ptr[kMuonGrad][t], start);
    __nv_bfloat16* update = list_at<__nv_bfloat16>(meta.ptr[kMuonUpdate][t], start);
    const bool write_grad = s.write_grads && c.inv_scale != 1.f;
    // the momentum rounds to nearest (stochastic rounding of it is refused)
    const auto states = step_states<state_t, 1>(meta, t, start, {{kMuonBuffer}, {true}, {false}, true}, kMuonAbsmax);
    const bool aligned = is_aligned(grad) && is_aligned(update);
    for_each_step_ilp(n, aligned, states, StepRounding{false, false, 0u, start}, [&](const IlpIndex& ix, float (&st)[1][kILP]) {
      float g[kILP], u[kILP];
      load_ilp(g, grad, ix);
      if (write_grad) {
        float unscaled[kILP];
#pragma unroll
        for (int j = 0; j < kILP; ++j) unscaled[j] = g[j] * c.inv_scale;
        store_ilp(grad, unscaled, ix);
      }
#pragma unroll
      for (int j = 0; j < kILP; ++j) u[j] = ops::muon_momentum(g[j], st[0][j], c);
      store_ilp(update, u, ix);
    });
  }
};

// The launches of one state dtype, for the runtime grad dtype.
struct GradDispatch {
  Dtype grad;
  const std::vector<TensorPtrs>& tensors;
  const ops::MuonHyper& h;
  const StepScalars& s;
  cudaStream_t stream;

  template <typename state_t>
  void run() const {
    switch (grad) {
      case Dtype::Float: return apply_step<4, state_t>(tensors, MuonFunctor<float, state_t>{h, s}, stream);
      case Dtype::Half: return apply_step<4, state_t>(tensors, MuonFunctor<__half, state_t>{h, s}, stream);
      case Dtype::BFloat16:
        return apply_step<4, state_t>(tensors, MuonFunctor<__nv_bfloat16, state_t>{h, s}, stream);
      case Dtype::Double:
      case Dtype::Byte: throw std::invalid_argument("fused_amp: float64 and uint8 params are not supported");
    }
  }
};

}  // namespace

void muon(const StepKind& kind, const std::vector<TensorPtrs>& tensors, const ops::MuonHyper& h,
          const StepScalars& s, cudaStream_t stream) {
  dispatch_state(kind.state, GradDispatch{kind.param, tensors, h, s, stream});
}

}  // namespace fused_amp::cuda
