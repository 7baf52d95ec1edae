// Loss-scaling kernels: unscale / non-finite check over tensor lists, and the scale update.
#include <atomic>
#include <stdexcept>

#include "cuda/multi_tensor_apply.cuh"
#include "ops/unscale.h"

namespace fused_amp::cuda {

namespace {

template <typename T>
using opmath_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
struct UnscaleFunctor {
  float* found_inf;
  const float* inv_scale;

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t start, int64_t n) const {
    using R = opmath_t<T>;
    T* x = static_cast<T*>(meta.ptr[0][t]) + start;
    const R inv = static_cast<R>(*inv_scale);
    R nonfinite = R(0);
    for_each_ilp(n, is_aligned(x), [&](const IlpIndex& ix) {
      R r[kILP];
      load_ilp(r, x, ix);
#pragma unroll
      for (int j = 0; j < kILP; ++j) r[j] = ops::unscale(r[j], inv, nonfinite);
      // x * 1 == x: torch writes nothing back for inv_scale 1 either.
      if (inv != R(1)) store_ilp(x, r, ix);
    });
    if (ops::any_nan(nonfinite)) *found_inf = 1.f;  // never a sum: every writer writes 1
  }
};

using ops::Bits;

// The check alone, on the raw bits (ops::exponent_all_ones): no conversion, memory speed.
template <typename T>
struct NonFiniteCheckFunctor {
  float* found_inf;
  Bits<T> exponent;

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t start, int64_t n) const {
    const Bits<T>* x = static_cast<const Bits<T>*>(meta.ptr[0][t]) + start;
    Bits<T> found = 0;
    for_each_ilp(n, is_aligned(x), [&](const IlpIndex& ix) {
      Bits<T> r[kILP];
      load_ilp(r, x, ix);  // lanes past the end read as 0: finite
#pragma unroll
      for (int j = 0; j < kILP; ++j) found = found | ops::exponent_all_ones(r[j], exponent);
    });
    if (found) *found_inf = 1.f;
  }
};

template <typename T>
void unscale_typed(const std::vector<TensorPtrs>& tensors, float* found_inf,
                   const float* inv_scale, Bits<T> exponent, cudaStream_t stream) {
  if (inv_scale) {
    multi_tensor_apply<1>(tensors, UnscaleFunctor<T>{found_inf, inv_scale}, stream);
  } else {
    multi_tensor_apply<1>(tensors, NonFiniteCheckFunctor<T>{found_inf, exponent}, stream);
  }
}

FA_GLOBAL void update_scale_kernel(float* scale, int* growth_tracker, int* overflows_in_row,
                                   const float* found_inf, ops::ScaleUpdateArgs args) {
  int local_overflows = 0;
  ops::update_scale(*scale, *growth_tracker, overflows_in_row ? *overflows_in_row : local_overflows,
                    *found_inf != 0.f, args);
}

// Each thread updates scales of its block's chunk of a tensor's scales, one after another.
struct DelayedScalingFunctor {
  int64_t length;
  ops::DelayedScalingArgs args;

  template <class Meta>
  FA_DEVICE void operator()(const Meta& meta, int t, int64_t start, int64_t n) const {
    float* const history = static_cast<float*>(meta.ptr[0][t]);
    float* const scale = static_cast<float*>(meta.ptr[1][t]);
    float* const scale_inv = static_cast<float*>(meta.ptr[2][t]);
    const float* const reduced = static_cast<const float*>(meta.ptr[3][t]);
    for (int64_t c = start + threadIdx.x; c < start + n; c += blockDim.x) {
      ops::delayed_scale_update(history + c, length, meta.numel[t], reduced ? reduced + c : nullptr, scale[c],
                                scale_inv[c], args);
    }
  }
};

}  // namespace

namespace {
std::atomic<int> forced_kernel_arg_bytes{0};
}  // namespace

void set_kernel_arg_bytes(int bytes) {
  if (bytes != 0 && bytes != 4096 && bytes != 32768) {
    throw std::invalid_argument("kernel argument bytes must be 0 (auto), 4096 or 32768");
  }
  forced_kernel_arg_bytes = bytes;
}

bool large_kernel_args() {
#if defined(FUSED_AMP_HOST_SIM)
  return fused_amp_sim_large_args;
#else
  if (const int forced = forced_kernel_arg_bytes.load()) return forced == 32768;
  static const bool ok = [] {
    int driver = 0, runtime = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) return false;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) return false;
    return CUDART_VERSION >= 12010 && driver >= 12010 && runtime >= 12010;
  }();
  return ok;
#endif
}

void unscale(Dtype dtype, const std::vector<TensorPtrs>& tensors, float* found_inf,
             const float* inv_scale, cudaStream_t stream) {
  switch (dtype) {
    case Dtype::Float:
      unscale_typed<float>(tensors, found_inf, inv_scale, ops::kFloatExponent, stream);
      break;
    case Dtype::Half:
      unscale_typed<__half>(tensors, found_inf, inv_scale, ops::kHalfExponent, stream);
      break;
    case Dtype::BFloat16:
      unscale_typed<__nv_bfloat16>(tensors, found_inf, inv_scale, ops::kBFloat16Exponent, stream);
      break;
    case Dtype::Double:
      unscale_typed<double>(tensors, found_inf, inv_scale, ops::kDoubleExponent, stream);
      break;
  }
}

void update_scale(float* scale, int* growth_tracker, int* overflows_in_row, const float* found_inf,
                  const ops::ScaleUpdateArgs& args, cudaStream_t stream) {
  FA_LAUNCH(update_scale_kernel, 1, 1, stream, scale, growth_tracker, overflows_in_row, found_inf, args);
}

void delayed_scale_update(const std::vector<TensorPtrs>& tensors, int64_t length, const ops::DelayedScalingArgs& args,
                          cudaStream_t stream) {
  multi_tensor_apply<4>(tensors, DelayedScalingFunctor{length, args}, stream);
}

}  // namespace fused_amp::cuda
