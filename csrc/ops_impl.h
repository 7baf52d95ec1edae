#pragma once
// The ops' device implementations, registered with the dispatcher in register.cpp (CPU) and
// cuda/cuda_ops.cpp (CUDA). Argument meanings: see the schemas in register.cpp.
#include <ATen/core/Tensor.h>
#include <ATen/core/List.h>

#include <optional>

#define FUSED_AMP_DECLARE_OPS                                                                    \
  void unscale_(at::TensorList tensors, at::Tensor& found_inf, const at::Tensor& inv_scale);    \
  void non_finite_check_(at::TensorList tensors, at::Tensor& found_inf);                        \
  void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf, \
                     double growth_factor, double backoff_factor, int64_t growth_interval,      \
                     int64_t hysteresis, const std::optional<at::Tensor>& hysteresis_tracker,   \
                     std::optional<double> min_scale, std::optional<double> max_scale);         \
  void adam_step_(at::TensorList params, at::TensorList grads,                                  \
                  const c10::List<std::optional<at::Tensor>>& master_params,                   \
                  at::TensorList exp_avgs, at::TensorList exp_avg_sqs,                          \
                  at::TensorList max_exp_avg_sqs, at::TensorList steps, double lr,              \
                  const std::optional<at::Tensor>& lr_tensor, double beta1, double beta2,       \
                  double eps, double weight_decay, bool amsgrad, bool maximize,                 \
                  bool decoupled_weight_decay, const std::optional<at::Tensor>& inv_scale,      \
                  const std::optional<at::Tensor>& found_inf);                                  \
  void sgd_step_(at::TensorList params, at::TensorList grads,                                   \
                 const c10::List<std::optional<at::Tensor>>& master_params,                    \
                 at::TensorList momentum_buffers, at::TensorList steps, double lr,              \
                 const std::optional<at::Tensor>& lr_tensor, double momentum, double dampening, \
                 double weight_decay, bool nesterov, bool maximize,                             \
                 const std::optional<at::Tensor>& inv_scale,                                    \
                 const std::optional<at::Tensor>& found_inf);

namespace fused_amp::cpu { FUSED_AMP_DECLARE_OPS }
namespace fused_amp::cuda { FUSED_AMP_DECLARE_OPS }
