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
    state_t* buf = list_at<state_t>(meta.ptr[kMuonBuffer][t], start);
    __nv_bfloat16* update = list_at<__nv_bfloat16>(meta.ptr[kMuonUpdate][t], start);
    const bool write_grad = s.write_grads && c.inv_scale != 1.f;
    const bool aligned = is_aligned(grad) && is_aligned(buf) && is_aligned(update);
    for_each_ilp(n, aligned, [&](const IlpIndex& ix) {
      float g[kILP], b[kILP], u[kILP];
      load_ilp(g, grad, ix);
      load_ilp(b, buf, ix);
      if (write_grad) {
        float unscaled[kILP];
#pragma unroll
        for (int j = 0; j < kILP; ++j) unscaled[j] = g[j] * c.inv_scale;
        store_ilp(grad, unscaled, ix);
      }
#pragma unroll
      for (int j = 0; j < kILP; ++j) u[j] = ops::muon_momentum(g[j], b[j], c);
      store_ilp(update, u, ix);
      store_ilp(buf, b, ix);
    });
  }
};

template <typename state_t>
void launch_for_grad(Dtype grad, const std::vector<TensorPtrs>& tensors, const ops::MuonHyper& h,
                     const StepScalars& s, cudaStream_t stream) {
  switch (grad) {
    case Dtype::Float: return multi_tensor_apply<4>(tensors, MuonFunctor<float, state_t>{h, s}, stream);
    case Dtype::Half: return multi_tensor_apply<4>(tensors, MuonFunctor<__half, state_t>{h, s}, stream);
    case Dtype::BFloat16:
      return multi_tensor_apply<4>(tensors, MuonFunctor<__nv_bfloat16, state_t>{h, s}, stream);
    case Dtype::Double: throw std::invalid_argument("fused_amp: float64 params are not supported");
  }
}

}  // namespace

void muon(const StepKind& kind, const std::vector<TensorPtrs>& tensors, const ops::MuonHyper& h,
          const StepScalars& s, cudaStream_t stream) {
  if (kind.state == Dtype::BFloat16) {
    launch_for_grad<__nv_bfloat16>(kind.param, tensors, h, s, stream);
  } else {
    launch_for_grad<float>(kind.param, tensors, h, s, stream);
  }
}

}  // namespace fused_amp::cuda
