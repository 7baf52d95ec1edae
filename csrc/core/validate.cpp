#include "core/validate.h"

#include <c10/util/Exception.h>

namespace fused_amp::core {

bool is_reduced_or_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

bool is_floating_with_double(at::ScalarType t) { return is_reduced_or_float(t) || t == at::kDouble; }

at::Device list_device(const char* op, const char* name, at::TensorList list) {
  TORCH_CHECK_VALUE(!list.empty(), op, ": ", name, " must not be empty");
  return list[0].device();
}

void check_list(const char* op, const char* name, at::TensorList list, const at::Device& device,
                bool (*allowed)(at::ScalarType), const char* allowed_text) {
  for (size_t i = 0; i < list.size(); ++i) {
    const at::Tensor& t = list[i];
    TORCH_CHECK_VALUE(t.defined(), op, ": ", name, "[", i, "] is undefined");
    TORCH_CHECK_VALUE(t.layout() == at::kStrided, op, ": ", name, "[", i,
                      "] is sparse; only dense (strided) tensors are supported");
    TORCH_CHECK_VALUE(t.device() == device, op, ": ", name, "[", i, "] is on ", t.device(),
                      " but the tensors are on ", device, "; all tensors must be on one device");
    TORCH_CHECK_TYPE(allowed(t.scalar_type()), op, ": ", name, "[", i, "] has dtype ",
                     t.scalar_type(), "; supported dtypes are ", allowed_text);
    TORCH_CHECK_VALUE(t.is_non_overlapping_and_dense(), op, ": ", name, "[", i,
                      "] is not contiguous (its elements overlap or leave gaps: sizes ", t.sizes(),
                      ", strides ", t.strides(), "); pass a contiguous tensor");
  }
}

void check_scalar(const char* op, const char* name, const at::Tensor& t, const at::Device& device,
                  at::ScalarType dtype) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK_VALUE(t.numel() == 1, op, ": ", name, " must have exactly one element, got shape ",
                    t.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, op, ": ", name, " must be ", dtype, ", got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == device, op, ": ", name, " is on ", t.device(),
                    " but must be on ", device);
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, op, ": ", name, " is sparse");
}

void check_length(const char* op, const char* name, size_t got, size_t want, bool may_be_empty) {
  TORCH_CHECK_VALUE(got == want || (may_be_empty && got == 0), op, ": ", name, " has ", got,
                    " tensors but params has ", want, may_be_empty ? " (or pass none)" : "");
}

void check_partner(const char* op, const char* name, size_t i, const at::Tensor& t,
                   const at::Tensor& param, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", name, "[", i, "] is undefined");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, op, ": ", name, "[", i,
                    "] is sparse; sparse gradients are not supported");
  TORCH_CHECK_TYPE(!t.is_complex(), op, ": ", name, "[", i, "] is complex");
  TORCH_CHECK_VALUE(t.device() == param.device(), op, ": ", name, "[", i, "] is on ", t.device(),
                    " but params[", i, "] is on ", param.device());
  TORCH_CHECK_VALUE(t.sizes() == param.sizes(), op, ": ", name, "[", i, "] has shape ", t.sizes(),
                    " but params[", i, "] has shape ", param.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, op, ": ", name, "[", i, "] has dtype ",
                   t.scalar_type(), ", expected ", dtype);
  TORCH_CHECK_VALUE(t.strides() == param.strides(), op, ": ", name, "[", i, "] has strides ",
                    t.strides(), " but params[", i, "] has strides ", param.strides(),
                    "; the update is element-wise over memory, so both need the same layout");
}

}  // namespace fused_amp::core

namespace fused_amp::core {

void validate_unscale(const char* op, at::TensorList tensors, const at::Tensor& found_inf,
                      const at::Tensor* inv_scale) {
  check_scalar(op, "found_inf", found_inf, found_inf.device());
  if (inv_scale) check_scalar(op, "inv_scale", *inv_scale, found_inf.device());
  check_list(op, "tensors", tensors, found_inf.device(), is_floating_with_double,
             "float32, float16, bfloat16 and float64");
}

ops::ScaleUpdateArgs update_scale_args(const at::Tensor& scale, const at::Tensor& growth_tracker,
                           const at::Tensor& found_inf, double growth_factor,
                           double backoff_factor, int64_t growth_interval,
                           int64_t hysteresis, const std::optional<at::Tensor>& hysteresis_tracker,
                           std::optional<double> min_scale, std::optional<double> max_scale) {
  const char* op = "update_scale_";
  const at::Device device = scale.device();
  check_scalar(op, "scale", scale, device);
  check_scalar(op, "growth_tracker", growth_tracker, device, at::kInt);
  check_scalar(op, "found_inf", found_inf, device);
  TORCH_CHECK_VALUE(growth_interval > 0, op, ": growth_interval must be positive, got ",
                    growth_interval);
  TORCH_CHECK_VALUE(hysteresis >= 1, op, ": hysteresis must be at least 1, got ", hysteresis);
  TORCH_CHECK_VALUE(hysteresis == 1 || (hysteresis_tracker && hysteresis_tracker->defined()), op,
                    ": hysteresis=", hysteresis, " needs a hysteresis_tracker tensor");
  if (hysteresis_tracker && hysteresis_tracker->defined()) {
    check_scalar(op, "hysteresis_tracker", *hysteresis_tracker, device, at::kInt);
  }
  TORCH_CHECK_VALUE(!min_scale || *min_scale > 0, op, ": min_scale must be positive, got ",
                    min_scale.value_or(0));
  TORCH_CHECK_VALUE(!min_scale || !max_scale || *min_scale <= *max_scale, op, ": min_scale (",
                    min_scale.value_or(0), ") is larger than max_scale (", max_scale.value_or(0), ")");
  return {growth_factor,
          backoff_factor,
          static_cast<int>(growth_interval),
          static_cast<int>(hysteresis),
          min_scale.has_value(),
          max_scale.has_value(),
          static_cast<float>(min_scale.value_or(0.0)),
          static_cast<float>(max_scale.value_or(0.0))};
}

}  // namespace fused_amp::core
