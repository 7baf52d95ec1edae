#include "core/validate.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace fused_amp::core {

bool is_reduced_or_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

bool is_floating_with_double(at::ScalarType t) { return is_reduced_or_float(t) || t == at::kDouble; }

at::Device list_device(const char* op, const char* name, at::TensorList list) {
  TORCH_CHECK_VALUE(!list.empty(), op, ": ", name, " must not be empty");
  return list[0].device();
}

namespace {

void check_no_overlap(const char* op, const char* name, size_t i, const at::Tensor& t) {
  TORCH_CHECK_VALUE(at::has_internal_overlap(t) != at::MemOverlap::Yes, op, ": ", name, "[", i,
                    "] has elements that share memory (sizes ", t.sizes(), ", strides ",
                    t.strides(), ", e.g. from expand()); the op writes it, so pass a tensor whose "
                    "elements are distinct (.clone())");
}

// Dense, with the strides of `like` wherever the size is > 1 (a size-1 dim may carry any stride).
bool has_layout(const at::Tensor& t, const at::Tensor& like) {
  if (!t.is_non_overlapping_and_dense()) return false;
  if (t.strides() == like.strides()) return true;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) != like.stride(d)) return false;
  }
  return true;
}

}  // namespace

at::Tensor Staging::stage(const at::Tensor& t, at::Tensor staged, bool written) {
  staged.copy_(t);
  if (written) written_.emplace_back(t, staged);
  return staged;
}

at::Tensor Staging::dense(const at::Tensor& t, bool written) {
  if (t.is_non_overlapping_and_dense()) return t;
  return stage(t, at::empty(t.sizes(), t.options()), written);
}

at::Tensor Staging::like(const at::Tensor& t, const at::Tensor& like, bool written) {
  if (has_layout(t, like)) return t;
  return stage(t, at::empty_strided(t.sizes(), like.strides(), t.options()), written);
}

void Staging::copy_back() {
  for (auto& [user, staged] : written_) user.copy_(staged);
  written_.clear();
}

void check_distinct(const char* op, const char* name, at::TensorList list) {
  if (list.size() < 2) return;
  std::vector<std::pair<const void*, size_t>> starts;  // (first element, index)
  starts.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    // (fake and meta tensors, under torch.compile's tracing, have no memory to share)
    const void* start = list[i].numel() > 0 && !list[i].is_meta() ? list[i].data_ptr() : nullptr;
    if (start != nullptr) starts.emplace_back(start, i);
  }
  std::sort(starts.begin(), starts.end());
  // name the first repeat in list order: the smallest j whose tensor appeared before, at i
  size_t i = 0, j = list.size();
  for (size_t k = 1; k < starts.size(); ++k) {
    const bool repeats = starts[k].first == starts[k - 1].first;
    const bool run_start = k < 2 || starts[k - 1].first != starts[k - 2].first;
    if (repeats && run_start && starts[k].second < j) {
      i = starts[k - 1].second;
      j = starts[k].second;
    }
  }
  TORCH_CHECK_VALUE(j == list.size(), op, ": ", name, "[", i, "] and ", name, "[", j, "] are the same "
                    "memory; the op writes them, so each tensor may appear once (a param repeated "
                    "in a param group, or two params sharing one grad tensor)");
}

void check_list(const char* op, const char* name, at::TensorList list, const at::Device& device,
                bool (*allowed)(at::ScalarType), const char* allowed_text, bool written) {
  for (size_t i = 0; i < list.size(); ++i) {
    const at::Tensor& t = list[i];
    TORCH_CHECK_VALUE(t.defined(), op, ": ", name, "[", i, "] is undefined");
    TORCH_CHECK_VALUE(t.layout() == at::kStrided, op, ": ", name, "[", i,
                      "] is sparse; only dense (strided) tensors are supported");
    TORCH_CHECK_VALUE(t.device() == device, op, ": ", name, "[", i, "] is on ", t.device(),
                      " but the tensors are on ", device, "; all tensors must be on one device");
    TORCH_CHECK_TYPE(allowed(t.scalar_type()), op, ": ", name, "[", i, "] has dtype ",
                     t.scalar_type(), "; supported dtypes are ", allowed_text);
    if (written) check_no_overlap(op, name, i, t);
  }
  if (written) check_distinct(op, name, list);
}

std::ostream& operator<<(std::ostream& out, const TensorName& name) {
  out << name.list;
  if (name.index >= 0) out << "[" << name.index << "]";
  if (name.note) out << " (" << name.note << ")";
  return out;
}

void check_scalar(const char* op, const TensorName& name, const at::Tensor& t, const at::Device& device,
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

void check_weight_amax(const char* op, const at::Tensor& amax, at::TensorList params, bool writes_output) {
  TORCH_CHECK_VALUE(!writes_output, op, ": weight_amax is for optimizers that write their params; this one writes "
                    "outputs");
  TORCH_CHECK_TYPE(amax.scalar_type() == at::kFloat, op, ": weight_amax must be float32, got ", amax.scalar_type());
  TORCH_CHECK_VALUE(amax.dim() == 1 && amax.numel() == static_cast<int64_t>(params.size()) && amax.is_contiguous(),
                    op, ": weight_amax must be a contiguous 1-D tensor of one element per param (",
                    params.size(), "), got shape ", amax.sizes());
  if (!params.empty()) {
    TORCH_CHECK_VALUE(amax.device() == params[0].device(), op, ": weight_amax is on ", amax.device(),
                      " but must be on ", params[0].device());
  }
}

void check_length(const char* op, const char* name, size_t got, size_t want, bool may_be_empty) {
  TORCH_CHECK_VALUE(got == want || (may_be_empty && got == 0), op, ": ", name, " has ", got,
                    " tensors but params has ", want, may_be_empty ? " (or pass none)" : "");
}

void check_partner(const char* op, const char* name, size_t i, const at::Tensor& t,
                   const at::Tensor& param, at::ScalarType dtype, bool written, std::optional<size_t> param_index) {
  const size_t j = param_index.value_or(i);
  TORCH_CHECK_VALUE(t.defined(), op, ": ", name, "[", i, "] is undefined");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, op, ": ", name, "[", i,
                    "] is sparse; sparse gradients are not supported");
  TORCH_CHECK_TYPE(!t.is_complex(), op, ": ", name, "[", i, "] is complex");
  TORCH_CHECK_VALUE(t.device() == param.device(), op, ": ", name, "[", i, "] is on ", t.device(),
                    " but params[", j, "] is on ", param.device());
  TORCH_CHECK_VALUE(t.sizes() == param.sizes(), op, ": ", name, "[", i, "] has shape ", t.sizes(),
                    " but params[", j, "] has shape ", param.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, op, ": ", name, "[", i, "] has dtype ",
                   t.scalar_type(), ", expected ", dtype);
  if (written) check_no_overlap(op, name, i, t);
}

}  // namespace fused_amp::core

namespace fused_amp::core {

std::vector<at::Tensor> validate_unscale(const char* op, at::TensorList tensors,
                                         const at::Tensor& found_inf, const at::Tensor* inv_scale,
                                         bool written, Staging* staging) {
  check_scalar(op, "found_inf", found_inf, found_inf.device());
  if (inv_scale) check_scalar(op, "inv_scale", *inv_scale, found_inf.device());
  check_list(op, "tensors", tensors, found_inf.device(), is_floating_with_double,
             "float32, float16, bfloat16 and float64", written);
  std::vector<at::Tensor> out;
  if (!staging) return out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(staging->dense(t, written));
  return out;
}

ops::NormKind validate_grad_norm(const char* op, const at::Tensor& norm, const at::Tensor& found_inf,
                                 double norm_type) {
  check_scalar(op, "norm", norm, found_inf.device());
  if (norm_type == 2.0) return ops::NormKind::L2;
  if (norm_type == 1.0) return ops::NormKind::L1;
  TORCH_CHECK_VALUE(std::isinf(norm_type) && norm_type > 0, op,
                    ": norm_type must be 1.0, 2.0 or inf, got ", norm_type);
  return ops::NormKind::Inf;
}

ops::DelayedScalingArgs delayed_scaling_args(const DelayedScalingTensors& t, double fp8_max, double margin,
                                             c10::string_view amax_compute_algo) {
  const char* op = "delayed_scale_update_";
  TORCH_CHECK_VALUE(amax_compute_algo == "max" || amax_compute_algo == "most_recent", op,
                    ": amax_compute_algo must be \"max\" or \"most_recent\", got \"", amax_compute_algo, "\"");
  constexpr double kFloatMax = std::numeric_limits<float>::max();  // (casting beyond it is undefined)
  TORCH_CHECK_VALUE(fp8_max > 0.0 && fp8_max <= kFloatMax, op,
                    ": fp8_max must be a positive, finite float32 value, got ", fp8_max);
  TORCH_CHECK_VALUE(std::abs(margin) <= kFloatMax, op, ": margin must be a finite float32 value, got ", margin);
  const float scaled_max = static_cast<float>(fp8_max) * std::pow(2.f, -static_cast<float>(margin));
  TORCH_CHECK_VALUE(scaled_max > 0.f && std::isfinite(scaled_max), op,
                    ": fp8_max * 2^-margin must be a positive, finite float32 value, got margin ", margin);
  check_length(op, "scales", t.scales.size(), t.histories.size(), false);
  check_length(op, "scale_invs", t.scale_invs.size(), t.histories.size(), false);
  int64_t columns = 0;
  for (size_t i = 0; i < t.histories.size(); ++i) {
    const std::string h = "amax_histories[" + std::to_string(i) + "]";
    const at::Tensor& history = t.histories[i];
    TORCH_CHECK_TYPE(history.scalar_type() == at::kFloat, op, ": ", h, " must be float32, got ", history.scalar_type());
    TORCH_CHECK_VALUE(history.dim() == 2 && history.size(0) >= 1 && history.is_contiguous(), op, ": ", h,
                      " must be a contiguous [history length, scales] tensor, got shape ", history.sizes());
    TORCH_CHECK_VALUE(history.size(0) == t.histories[0].size(0), op, ": ", h, " has ", history.size(0),
                      " rows but amax_histories[0] has ", t.histories[0].size(0), ": one history length for all");
    TORCH_CHECK_VALUE(history.device() == t.histories[0].device(), op, ": ", h, " is on ", history.device(),
                      " but amax_histories[0] is on ", t.histories[0].device());
    for (const auto& [name, list] : {std::pair{"scales", t.scales}, std::pair{"scale_invs", t.scale_invs}}) {
      const at::Tensor& s = list[i];
      const std::string where = std::string(name) + "[" + std::to_string(i) + "]";
      TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, op, ": ", where, " must be float32, got ", s.scalar_type());
      TORCH_CHECK_VALUE(s.numel() == history.size(1) && s.is_contiguous(), op, ": ", where, " must be contiguous with ",
                        history.size(1), " elements (", h, "'s columns), got shape ", s.sizes());
      TORCH_CHECK_VALUE(s.device() == history.device(), op, ": ", where, " is on ", s.device(), " but ", h,
                        " is on ", history.device());
    }
    columns += history.size(1);
  }
  check_distinct(op, "amax_histories", t.histories);
  check_distinct(op, "scales", t.scales);
  check_distinct(op, "scale_invs", t.scale_invs);
  if (t.reduced) {
    const at::Tensor& r = *t.reduced;
    TORCH_CHECK_TYPE(r.scalar_type() == at::kFloat, op, ": amax_reduction_buffer must be float32, got ",
                     r.scalar_type());
    TORCH_CHECK_VALUE(r.dim() == 1 && r.numel() == columns && r.is_contiguous(), op,
                      ": amax_reduction_buffer must be a contiguous 1-D tensor of every history's columns (", columns,
                      "), got shape ", r.sizes());
    TORCH_CHECK_VALUE(t.histories.empty() || r.device() == t.histories[0].device(), op,
                      ": amax_reduction_buffer is on ", r.device(), " but amax_histories[0] is on ",
                      t.histories[0].device());
  }
  return {scaled_max, amax_compute_algo == "most_recent"};
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
  // The trackers are int32, as torch's: values they cannot hold are refused, not wrapped.
  // (growth_interval <= 0 is accepted, as torch accepts it: the scale then never grows.)
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  TORCH_CHECK_VALUE(growth_interval >= std::numeric_limits<int32_t>::min() &&
                        growth_interval <= kIntMax,
                    op, ": growth_interval must fit in int32, got ", growth_interval);
  TORCH_CHECK_VALUE(hysteresis >= 1 && hysteresis <= kIntMax, op,
                    ": hysteresis must be at least 1 and fit in int32, got ", hysteresis);
  TORCH_CHECK_VALUE(hysteresis == 1 || (hysteresis_tracker && hysteresis_tracker->defined()), op,
                    ": hysteresis=", hysteresis, " needs a hysteresis_tracker tensor");
  if (hysteresis_tracker && hysteresis_tracker->defined()) {
    check_scalar(op, "hysteresis_tracker", *hysteresis_tracker, device, at::kInt);
  }
  // The scale is fp32: a bound must be a positive fp32 value, not one that rounds to 0 or inf.
  for (const auto& [name, bound] : {std::pair{"min_scale", min_scale}, std::pair{"max_scale", max_scale}}) {
    if (!bound) continue;
    const float as_float = static_cast<float>(*bound);
    TORCH_CHECK_VALUE(as_float > 0.f && std::isfinite(as_float), op, ": ", name,
                      " must be a positive, finite float32 value, got ", *bound);
  }
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
