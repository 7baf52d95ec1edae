#pragma once
// Argument checks shared by the CPU and CUDA entry points. Each raises a Python ValueError or
// TypeError naming the op and the argument, and runs before any tensor is written.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <ostream>
#include <utility>
#include <vector>

#include "ops/grad_norm.h"
#include "ops/update_scale.h"

namespace fused_amp::core {

// Every tensor of `list` is strided, on `device`, and of a floating dtype accepted by `allowed`;
// when the op writes it (`written`), no two of its elements share memory.
void check_list(const char* op, const char* name, at::TensorList list, const at::Device& device,
                bool (*allowed)(at::ScalarType), const char* allowed_text, bool written);

// No two tensors of `list`, which the op writes, start at the same memory (the same tensor
// repeated): the kernels would update it from several threads or blocks at once.
void check_distinct(const char* op, const char* name, at::TensorList list);

// What a message calls a tensor: a name, or a list's element (`steps[3]`, with a note:
// `scalar_states[0] (mu_product)`), written out only when a check fails (a step checks each
// param's scalars at every call).
struct TensorName {
  TensorName(const char* name) : list(name) {}  // NOLINT(runtime/explicit): a plain name
  TensorName(const char* list, size_t index, const char* note = nullptr)
      : list(list), index(static_cast<int64_t>(index)), note(note) {}
  const char* list;
  int64_t index = -1;  // none: a plain name
  const char* note = nullptr;
};
std::ostream& operator<<(std::ostream& out, const TensorName& name);

// A one-element fp32 tensor on `device` (found_inf, inv_scale, scale, ...).
void check_scalar(const char* op, const TensorName& name, const at::Tensor& t, const at::Device& device,
                  at::ScalarType dtype = at::kFloat);

// weight_amax of step_: fp32, one element per param (contiguous), on the params' device, and
// only for an optimizer that writes its params (not `writes_output`).
void check_weight_amax(const char* op, const at::Tensor& amax, at::TensorList params, bool writes_output);

// `list` has as many tensors as the params (or none, when `may_be_empty`).
void check_length(const char* op, const char* name, size_t got, size_t want, bool may_be_empty);

// `t` (element i of `name`) matches `param` (params[param_index], or params[i] by default) in
// device and shape, and has `dtype`; when the op writes it, no two of its elements share memory.
// Its layout may differ (see Staging).
void check_partner(const char* op, const char* name, size_t i, const at::Tensor& t,
                   const at::Tensor& param, at::ScalarType dtype, bool written,
                   std::optional<size_t> param_index = std::nullopt);

// The kernels walk each tensor as one flat run of memory, in the same element order as its
// param. A tensor that is not dense, or is laid out otherwise than its param (a transposed
// grad, state saved in another memory format), is staged: the kernel gets a dense copy in the
// reference layout, and the copies of tensors the op writes go back once the kernel has run.
// The usual dense case costs a layout comparison and nothing more.
class Staging {
 public:
  // `t` itself when it is dense, else a staged contiguous copy.
  at::Tensor dense(const at::Tensor& t, bool written);
  // `t` itself when it is dense and laid out as `like` (a dense tensor of its shape), else a
  // staged copy in the layout of `like`.
  at::Tensor like(const at::Tensor& t, const at::Tensor& like, bool written);
  void copy_back();

 private:
  at::Tensor stage(const at::Tensor& t, at::Tensor staged, bool written);
  std::vector<std::pair<at::Tensor, at::Tensor>> written_;  // (user tensor, staged copy)
};

bool is_reduced_or_float(at::ScalarType t);      // fp32, fp16, bf16
bool is_floating_with_double(at::ScalarType t);  // fp64 too

// The device of the first tensor of a list (lists checked separately may be empty).
at::Device list_device(const char* op, const char* name, at::TensorList list);

}  // namespace fused_amp::core

namespace fused_amp::core {

// unscale_ / non_finite_check_ / grad_norm_: tensors on found_inf's device, fp32/fp16/bf16/fp64,
// strided (and without overlap when `written`). Returns the tensors the kernel walks (staged
// where not dense); none when `staging` is null.
std::vector<at::Tensor> validate_unscale(const char* op, at::TensorList tensors,
                                         const at::Tensor& found_inf, const at::Tensor* inv_scale,
                                         bool written, Staging* staging);

// grad_norm_'s output (one fp32 element on found_inf's device) and its norm type.
ops::NormKind validate_grad_norm(const char* op, const at::Tensor& norm, const at::Tensor& found_inf,
                                 double norm_type);

// The tensors update_scale_ writes and reads; hysteresis_tracker is null without hysteresis.
struct ScaleTensors {
  const at::Tensor& scale;
  const at::Tensor& growth_tracker;
  const at::Tensor& found_inf;
  const at::Tensor* hysteresis_tracker;
};

// The tensors delayed_scale_update_ writes and reads; `reduced` is null without a reduction buffer.
struct DelayedScalingTensors {
  at::TensorList histories, scales, scale_invs;
  const at::Tensor* reduced;
};

// delayed_scale_update_: fp32 contiguous tensors on one device; histories [length, n_i] of one
// length, scales and scale_invs of n_i elements, the reduction buffer of all n_i in order; the
// fp8 format's largest value and the margin give a positive finite scaled max. Returns the
// arguments of ops::delayed_scale_update.
ops::DelayedScalingArgs delayed_scaling_args(const DelayedScalingTensors& t, double fp8_max, double margin,
                                             c10::string_view amax_compute_algo);

// update_scale_: fp32 scale, int32 trackers, fp32 found_inf, all one-element on one device;
// returns the arguments of ops::update_scale.
ops::ScaleUpdateArgs update_scale_args(const at::Tensor& scale, const at::Tensor& growth_tracker,
                           const at::Tensor& found_inf, double growth_factor,
                           double backoff_factor, int64_t growth_interval,
                           int64_t hysteresis, const std::optional<at::Tensor>& hysteresis_tracker,
                           std::optional<double> min_scale, std::optional<double> max_scale);

}  // namespace fused_amp::core
