// The global norm of the unscaled grads (grad_norm_): one read of every grad that also flags
// inf/NaN. Deterministic: each chunk's block reduces in a fixed tree into its own slot of
// `partials`, and one block then combines the slots in a fixed order.
#include "cuda/multi_tensor_apply.cuh"
#include "ops/grad_norm.h"

namespace fused_amp::cuda {

namespace {

template <typename T>
using opmath_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// This thread's share of one chunk: its kILP-element slices in order, in the op-math type.
template <ops::NormKind kKind, typename T, typename R>
FA_DEVICE R chunk_partial(const T* x, int64_t n, R inv_scale, R& nonfinite) {
  R acc = R(0);
  for_each_ilp(n, is_aligned(x), [&](const IlpIndex& ix) {
    R r[kILP];
    load_ilp(r, x, ix);  // lanes past the end read as 0, which changes no norm
#pragma unroll
    for (int j = 0; j < kILP; ++j) {
      nonfinite = nonfinite + ops::nonfinite_probe(r[j]);
      acc = ops::norm_accumulate<kKind>(acc, r[j] * inv_scale);
    }
  });
  return acc;
}

template <typename T>
struct NormChunkFunctor {
  using acc_t = opmath_t<T>;
  float* found_inf;
  const float* inv_scale;  // null: the grads are unscaled already
  ops::NormKind kind;

  // lists: 0 the tensor, 1 its slots in `partials` (one per chunk)
  template <class Meta>
  FA_DEVICE acc_t partial(const Meta& meta, int t, int64_t start, int64_t n) const {
    const T* x = static_cast<const T*>(meta.ptr[0][t]) + start;
    const acc_t inv = inv_scale ? static_cast<acc_t>(*inv_scale) : acc_t(1);
    acc_t nonfinite = acc_t(0);
    acc_t acc;
    switch (kind) {
      case ops::NormKind::L2: acc = chunk_partial<ops::NormKind::L2>(x, n, inv, nonfinite); break;
      case ops::NormKind::L1: acc = chunk_partial<ops::NormKind::L1>(x, n, inv, nonfinite); break;
      default: acc = chunk_partial<ops::NormKind::Inf>(x, n, inv, nonfinite); break;
    }
    if (ops::any_nan(nonfinite)) *found_inf = 1.f;  // every writer writes 1
    return acc;
  }
  FA_DEVICE acc_t combine(acc_t a, acc_t b) const { return ops::norm_combine(kind, a, b); }
  template <class Meta>
  FA_DEVICE void finish(const Meta& meta, int t, int chunk, acc_t v) const {
    static_cast<double*>(meta.ptr[1][t])[chunk] = static_cast<double>(v);
  }
};

// One block: thread i combines slots i, i + blockDim, ... in order, then the block's tree.
struct NormTotal {
  using acc_t = double;
  const double* partials;
  int64_t count;
  float* norm;
  ops::NormKind kind;

  FA_DEVICE double partial() const {
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc = ops::norm_combine(kind, acc, partials[i]);
    return acc;
  }
  FA_DEVICE double combine(double a, double b) const { return ops::norm_combine(kind, a, b); }
  FA_DEVICE void finish(double v) const { *norm = ops::norm_finish(kind, v); }
};

template <typename T>
void partials_typed(const std::vector<TensorPtrs>& tensors, float* found_inf,
                    const float* inv_scale, ops::NormKind kind, cudaStream_t stream) {
  multi_tensor_apply<2, true>(tensors, NormChunkFunctor<T>{found_inf, inv_scale, kind}, stream);
}

}  // namespace

int64_t norm_chunks(int64_t numel) { return (numel + kChunkSize - 1) / kChunkSize; }

void grad_norm_partials(Dtype dtype, const std::vector<TensorPtrs>& tensors, float* found_inf,
                        const float* inv_scale, ops::NormKind kind, cudaStream_t stream) {
  switch (dtype) {
    case Dtype::Float: partials_typed<float>(tensors, found_inf, inv_scale, kind, stream); break;
    case Dtype::Half: partials_typed<__half>(tensors, found_inf, inv_scale, kind, stream); break;
    case Dtype::BFloat16:
      partials_typed<__nv_bfloat16>(tensors, found_inf, inv_scale, kind, stream);
      break;
    case Dtype::Double: partials_typed<double>(tensors, found_inf, inv_scale, kind, stream); break;
  }
}

void grad_norm_total(const double* partials, int64_t count, float* norm, ops::NormKind kind,
                     cudaStream_t stream) {
  launch_block_reduce(1, NormTotal{partials, count, norm, kind}, stream);
}

}  // namespace fused_amp::cuda
