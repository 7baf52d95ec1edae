// The CUDA launcher and kernels (csrc/cuda/*.cu) compiled for the host and run on the emulator
// of tests/cuda_sim/emulator/ (FUSED_AMP_HOST_SIM), behind a C interface for ctypes. The tests build
// it twice: with small chunk and metadata sizes (FUSED_AMP_SIM_*), so that every boundary of the
// launch plan is reached with small tensors, and with the sizes a GPU runs. Every entry point
// returns 0, or 1 after an error (a finding of the emulator, or a refused argument), whose text
// fa_sim_error() then gives (entry.h).
#include "cuda/amp.cu"
#include "cuda/norm.cu"
#include "cuda/optimizer_step.cu"
#include "entry.h"

using namespace fused_amp::cuda;
using fused_amp::MasterKind;
using fused_amp::StateKind;

namespace {

std::vector<TensorPtrs> tensors_of(int n, int lists, void** ptrs, const int64_t* numels) {
  std::vector<TensorPtrs> out(n);
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < lists; ++k) out[i].p[k] = ptrs[i * lists + k];
    out[i].numel = numels[i];
  }
  return out;
}

StepKind step_kind(const int* kind) {
  return {static_cast<Dtype>(kind[0]), static_cast<MasterKind>(kind[1]), static_cast<StateKind>(kind[2])};
}

// An optimizer's lists per tensor: with codes (8- or 4-bit state) their absmaxes follow, then kind[3] lists of
// launch.h's last four: 1, the amax slot; 4, the amax slot, the fp8 codes, their scale and its inverse.
int lists_of(int lists, const int* kind) { return lists + fused_amp::is_quantized(static_cast<StateKind>(kind[2])) + kind[3]; }

}  // namespace

extern "C" {

int fa_sim_launches() { return fused_amp_sim_launches; }

int fa_sim_unscale(int dtype, int n, void** ptrs, const int64_t* numels, float* found_inf,
                   const float* inv_scale, int large) {
  return guarded([&] {
    fused_amp_sim_large_args = large;
    unscale(static_cast<Dtype>(dtype), tensors_of(n, 1, ptrs, numels), found_inf, inv_scale, nullptr);
  });
}

// grad_norm_ over tensors of one dtype; `partials` has room for every chunk of every tensor.
int fa_sim_grad_norm(int dtype, int n, void** ptrs, const int64_t* numels, double* partials,
                     float* found_inf, const float* inv_scale, int kind, float* norm, int large) {
  return guarded([&] {
    fused_amp_sim_large_args = large;
    auto list = tensors_of(n, 1, ptrs, numels);
    double* slot = partials;
    for (auto& t : list) {
      t.p[1] = slot;
      slot += norm_chunks(t.numel);
    }
    const auto k = static_cast<fused_amp::ops::NormKind>(kind);
    grad_norm_partials(static_cast<Dtype>(dtype), list, found_inf, inv_scale, k, nullptr);
    grad_norm_total(partials, slot - partials, norm, k, nullptr);
  });
}

int64_t fa_sim_norm_chunks(int64_t numel) { return norm_chunks(numel); }

// update_scale_: `bounds` = (min_scale, max_scale), each used when not NaN; `hysteresis_tracker`
// may be null.
int fa_sim_update_scale(float* scale, int* growth_tracker, int* hysteresis_tracker, const float* found_inf,
                        double growth_factor, double backoff_factor, int growth_interval, int hysteresis,
                        const float* bounds) {
  return guarded([&] {
    const fused_amp::ops::ScaleUpdateArgs args{growth_factor, backoff_factor, growth_interval, hysteresis,
                                               bounds[0] == bounds[0], bounds[1] == bounds[1], bounds[0], bounds[1]};
    update_scale(scale, growth_tracker, hysteresis_tracker, found_inf, args, nullptr);
  });
}

// delayed_scale_update_ over n tensors of 4 pointers each (history, scale, scale_inv, the
// reduction buffer's slice or null) and `numels` scales each, histories of `length` rows.
int fa_sim_delayed_scale_update(int n, void** ptrs, const int64_t* numels, int64_t length, float scaled_max,
                                int most_recent) {
  return guarded([&] {
    delayed_scale_update(tensors_of(n, 4, ptrs, numels), length, {scaled_max, most_recent != 0}, nullptr);
  });
}

// One step of `optimizer` (optimizers.h), then the step counts' increment. `kind`: param dtype,
// master kind (0 none, 1 fp32, 2 remainder, 3 24-bit), state dtype (4: 8-bit codes, with the
// absmaxes as one list more), and how many of launch.h's last four lists end the rows (1: each
// tensor's amax slot; 4: also its fp8 codes, their scale and its inverse; 0: none);
// `lists`: the lists per tensor (launch.h's StepList: param, grad,
// master (or output), the states, step, the scalar state if the optimizer keeps one); `hyper`: the
// optimizer's hyperparameters in its descriptor's order; with `stochastic` 1 bf16 state and
// 24-bit masters round stochastically with `seed`, 2 also 8-bit codes.
int fa_sim_step(const char* optimizer, const int* kind, int n, int lists, void** ptrs, const int64_t* numels,
                const double* hyper, double lr, const float* lr_ptr, const float* inv_scale, const float* found_inf,
                int write_grads, const float* grad_norm, float max_grad_norm, int stochastic, int64_t seed,
                int large) {
  return guarded([&] {
    fused_amp_sim_large_args = large;
    const auto list = tensors_of(n, lists_of(lists, kind), ptrs, numels);
    const int index = fused_amp::Optimizers::index_of(optimizer);
    step(index, step_kind(kind), list, hyper,
         {lr, lr_ptr, inv_scale, found_inf, write_grads != 0, grad_norm, max_grad_norm, stochastic != 0, seed,
          stochastic == 2},
         nullptr);
    int step = 0;
    fused_amp::Optimizers::at(index, [&]<class Opt>() { step = step_list(Opt::kStates); });
    std::vector<TensorPtrs> steps;  // SGD without momentum may count none
    for (int i = 0; i < n; ++i) {
      if (list[i].p[step]) steps.push_back(TensorPtrs{{list[i].p[step]}, 1});
    }
    increment_steps(steps, found_inf, nullptr);
  });
}

}  // extern "C"
