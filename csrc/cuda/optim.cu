// Optimizer kernels: one pass per step that reads each grad, updates the fp32 master (or the
// param itself) and the state, and writes the param back rounded to its dtype.
#include "cuda/multi_tensor_apply.cuh"

namespace fused_amp::cuda {

namespace {

template <typename T>
FA_DEVICE T* list_at(const void* const p, int64_t start) {
  return p ? static_cast<T*>(const_cast<void*>(p)) + start : nullptr;
}

// Everything both optimizers do around their math: skip on overflow, pick the fp32 value of the
// param (master or param), and write it back.
template <typename param_t, bool kHasMaster>
struct ParamAccess {
  param_t* param;
  param_t* grad;
  float* master;
  bool write_grad;  // leave the grad as the step used it (unscaled, clipped), as torch's recipe does

  FA_DEVICE bool aligned() const {
    return is_aligned(param) && is_aligned(grad) && (!kHasMaster || is_aligned(master));
  }
  FA_DEVICE void load(float (&p)[kILP], float (&g)[kILP], const IlpIndex& ix) const {
    if (kHasMaster) {
      load_ilp(p, master, ix);
    } else {
      load_ilp(p, param, ix);
    }
    load_ilp(g, grad, ix);
  }
  FA_DEVICE void store_unscaled_grad(const float (&g)[kILP], float inv_scale, const IlpIndex& ix) const {
    if (!write_grad) return;
    float u[kILP];
#pragma unroll
    for (int j = 0; j < kILP; ++j) u[j] = g[j] * inv_scale;
    store_ilp(grad, u, ix);
  }
  FA_DEVICE void store(const float (&p)[kILP], const IlpIndex& ix) const {
    if (kHasMaster) store_ilp(master, p, ix);
    store_ilp(param, p, ix);
  }
};

template <typename param_t, bool kHasMaster, class Meta>
FA_DEVICE ParamAccess<param_t, kHasMaster> param_access(const Meta& meta, int t, int64_t start,
                                                        bool write_grad) {
  return {list_at<param_t>(meta.ptr[kParam][t], start), list_at<param_t>(meta.ptr[kGrad][t], start),
          kHasMaster ? list_at<float>(meta.ptr[kMaster][t], start) : nullptr, write_grad};
}

FA_DEVICE bool skip(const StepScalars& s) { return s.found_inf && *s.found_inf != 0.f; }
FA_DEVICE double lr_of(const StepScalars& s) { return s.lr_ptr ? *s.lr_ptr : s.lr; }
// What the grads are multiplied by: the scaler's 1/scale, times the clip coefficient.
FA_DEVICE float grad_mult_of(const StepScalars& s) {
  const float inv = s.inv_scale ? *s.inv_scale : 1.f;
  return s.grad_norm ? inv * ops::clip_coef(*s.grad_norm, s.max_grad_norm) : inv;
}

template <typename param_t, bool kHasMaster>
struct AdamFunctor {
  ops::AdamHyper h;
  StepScalars s;

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t start, int64_t n) const {
    if (skip(s)) return;
    const float step = *static_cast<const float*>(meta.ptr[kAdamStep][t]) + 1.f;
    const ops::AdamCoeffs c = ops::adam_coeffs(h, lr_of(s), step, grad_mult_of(s));
    const auto pa = param_access<param_t, kHasMaster>(meta, t, start, s.write_grads && c.inv_scale != 1.f);
    float* m = list_at<float>(meta.ptr[kExpAvg][t], start);
    float* v = list_at<float>(meta.ptr[kExpAvgSq][t], start);
    float* vmax = c.amsgrad ? list_at<float>(meta.ptr[kMaxExpAvgSq][t], start) : nullptr;
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
      pa.store(p, ix);
      store_ilp(m, mr, ix);
      store_ilp(v, vr, ix);
      if (vmax) store_ilp(vmax, vmr, ix);
    });
  }
};

template <typename param_t, bool kHasMaster>
struct SgdFunctor {
  ops::SgdHyper h;
  StepScalars s;

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t start, int64_t n) const {
    if (skip(s)) return;
    const bool has_buf = h.momentum != 0.0;
    const bool first = has_buf && *static_cast<const float*>(meta.ptr[kSgdStep][t]) == 0.f;
    const ops::SgdCoeffs c = ops::sgd_coeffs(h, lr_of(s), first, grad_mult_of(s));
    const auto pa = param_access<param_t, kHasMaster>(meta, t, start, s.write_grads && c.inv_scale != 1.f);
    float* buf = has_buf ? list_at<float>(meta.ptr[kMomentumBuffer][t], start) : nullptr;
    const bool aligned = pa.aligned() && (!buf || is_aligned(buf));
    for_each_ilp(n, aligned, [&](const IlpIndex& ix) {
      float p[kILP], g[kILP], b[kILP] = {};
      pa.load(p, g, ix);
      if (buf && !first) load_ilp(b, buf, ix);
      pa.store_unscaled_grad(g, c.inv_scale, ix);
#pragma unroll
      for (int j = 0; j < kILP; ++j) ops::sgd_update(p[j], g[j], b[j], c);
      pa.store(p, ix);
      if (buf) store_ilp(buf, b, ix);
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

// Calls launch.run<param_t, kHasMaster>() for the runtime dtype and master flag.
template <class Launch>
void dispatch(Dtype dtype, bool has_master, const Launch& launch) {
  switch (dtype) {
    case Dtype::Float: launch.template run<float, false>(); break;
    case Dtype::Half:
      has_master ? launch.template run<__half, true>() : launch.template run<__half, false>();
      break;
    case Dtype::BFloat16:
      has_master ? launch.template run<__nv_bfloat16, true>()
                 : launch.template run<__nv_bfloat16, false>();
      break;
    case Dtype::Double: throw std::invalid_argument("fused_amp: float64 params are not supported");
  }
}

struct AdamLaunch {
  const std::vector<TensorPtrs>& tensors;
  const ops::AdamHyper& h;
  const StepScalars& s;
  cudaStream_t stream;
  template <typename param_t, bool kHasMaster>
  void run() const {
    multi_tensor_apply<7>(tensors, AdamFunctor<param_t, kHasMaster>{h, s}, stream);
  }
};

struct SgdLaunch {
  const std::vector<TensorPtrs>& tensors;
  const ops::SgdHyper& h;
  const StepScalars& s;
  cudaStream_t stream;
  template <typename param_t, bool kHasMaster>
  void run() const {
    multi_tensor_apply<5>(tensors, SgdFunctor<param_t, kHasMaster>{h, s}, stream);
  }
};

}  // namespace

void adam(Dtype param_dtype, bool has_master, const std::vector<TensorPtrs>& tensors,
          const ops::AdamHyper& h, const StepScalars& s, cudaStream_t stream) {
  dispatch(param_dtype, has_master, AdamLaunch{tensors, h, s, stream});
}

void sgd(Dtype param_dtype, bool has_master, const std::vector<TensorPtrs>& tensors,
         const ops::SgdHyper& h, const StepScalars& s, cudaStream_t stream) {
  dispatch(param_dtype, has_master, SgdLaunch{tensors, h, s, stream});
}

void increment_steps(const std::vector<TensorPtrs>& steps, const float* found_inf,
                     cudaStream_t stream) {
  multi_tensor_apply<1>(steps, IncrementStepFunctor{found_inf}, stream);
}

}  // namespace fused_amp::cuda
