#pragma once
// The CUDA entry points, free of torch headers: cuda_ops.cpp turns tensors into raw pointers
// and calls these; amp.cu, norm.cu and optimizer_step.cu implement them.
#include <cstdint>
#include <vector>

#ifdef FUSED_AMP_HOST_SIM
#include "cuda/compat.cuh"
#else
#include <cuda_runtime_api.h>
#endif

#include "ops/grad_norm.h"
#include "ops/optimizer.h"
#include "ops/update_scale.h"
#include "storage_kinds.h"

namespace fused_amp::cuda {

constexpr int kMaxLists = 12;

// One tensor as the kernels see it: up to kMaxLists partner pointers and its element count.
struct TensorPtrs {
  void* p[kMaxLists];
  int64_t numel;
};

enum class Dtype : int { Float, Half, BFloat16, Double };

// Which kernel-argument plan the launches use: 0 decides from the CUDA versions (32 KB where
// runtime and driver allow it), 4096 or 32768 forces one (for the tests of both plans).
void set_kernel_arg_bytes(int bytes);

// unscale_ (inv_scale given) or non_finite_check_ (inv_scale null) over tensors of one dtype.
void unscale(Dtype dtype, const std::vector<TensorPtrs>& tensors, float* found_inf,
             const float* inv_scale, cudaStream_t stream);

// grad_norm_ in two launches: each chunk of each tensor reduces into its slot of `partials`
// (tensor i's slots start where `tensors[i].p[1]` points; norm_chunks(numel) slots each) and
// flags inf/NaN; grad_norm_total then combines the `count` slots into `norm`.
int64_t norm_chunks(int64_t numel);
void grad_norm_partials(Dtype dtype, const std::vector<TensorPtrs>& tensors, float* found_inf,
                        const float* inv_scale, ops::NormKind kind, cudaStream_t stream);
void grad_norm_total(const double* partials, int64_t count, float* norm, ops::NormKind kind,
                     cudaStream_t stream);

void update_scale(float* scale, int* growth_tracker, int* overflows_in_row, const float* found_inf,
                  const ops::ScaleUpdateArgs& args, cudaStream_t stream);

// delayed_scale_update_ (ops::delayed_scale_update) over tensors of 4 lists: amax history
// [length, numel], scale, scale_inv, and the reduction buffer's slice (or null); numel: the
// tensor's scales.
void delayed_scale_update(const std::vector<TensorPtrs>& tensors, int64_t length, const ops::DelayedScalingArgs& args,
                          cudaStream_t stream);

// What every optimizer step reads besides the tensors; null pointers are absent.
struct StepScalars {
  double lr;
  const float* lr_ptr;     // a device lr, overriding lr
  const float* inv_scale;  // multiply the grads by it
  const float* found_inf;  // nonzero: write nothing
  bool write_grads;        // store the grad the step used (unscaled, clipped) back
  const float* grad_norm;  // clip: multiply the grads by ops::clip_coef(*grad_norm, max_grad_norm)
  float max_grad_norm;
  bool stochastic;        // bf16 state and 24-bit masters round stochastically (ops::rounding_key of rounding_seed)
  int64_t rounding_seed;
  bool stochastic_codes;  // so do 8-bit codes
};

// What one launch sequence of an optimizer step is compiled for: the storage kinds of
// storage_kinds.h (the host passes MasterKind::None for an optimizer that writes an output; the
// kernels take that from its descriptor).
struct StepKind {
  Dtype param;
  MasterKind master;
  StateKind state;
};

// Lists per tensor of an optimizer step: param, grad, master, the optimizer's kStates states
// (ops/optimizer.h), step, and its scalar state if it keeps one (master: the output of an
// optimizer that writes no param). All params share the kind's
// dtypes; master, the states not kept and SGD's step without momentum are null. With codes (8- or
// 4-bit state) one list more follows: the tensor's absmaxes, one row of its blocks per state
// kept, in state order. Then (after the absmaxes) the tensor's amax slot, null unless the step's
// weight amax is asked for (fp8 scaling): a zeroed uint32 into which the kernels max the
// ops::magnitude_bits of every param element they write. Last the fp8 weight's three lists, null
// unless one is asked for: its e4m3 codes, which the kernels write (ops/float8.h); its scale (one
// fp32), and where the kernels write the scale's inverse (or null); or, for an MX copy, null and
// its e8m0 block scales, which the kernels write.
enum StepList { kParam = 0, kGrad, kMasterList, kFirstState };
// The step count's list of an optimizer with `states` states (its scalar state's is the next).
constexpr int step_list(int states) { return kFirstState + states; }
// The lists of an optimizer with `states` states and `scalars` (0 or 1) scalar states, less the
// absmaxes' (the last, with codes).
constexpr int step_lists(int states, int scalars) { return step_list(states) + 1 + scalars; }
// The amax slot's list: the last, after the absmaxes' with codes (`quantized`).
constexpr int amax_list(int states, int scalars, bool quantized) { return step_lists(states, scalars) + quantized; }
// The fp8 weight's codes' list (its scale's and the inverse's are the next two, the last of all).
constexpr int float8_list(int states, int scalars, bool quantized) {
  return amax_list(states, scalars, quantized) + 1;
}

// One step of the optimizer at index `optimizer` of Optimizers (optimizers.h), its
// hyperparameters in its descriptor's order.
void step(int optimizer, const StepKind& kind, const std::vector<TensorPtrs>& tensors, const double* hyper,
          const StepScalars& s, cudaStream_t stream);

// steps[i] += 1 unless found_inf is nonzero; runs after the update that read the old steps.
void increment_steps(const std::vector<TensorPtrs>& steps, const float* found_inf,
                     cudaStream_t stream);

}  // namespace fused_amp::cuda
