#include "core/step_args.h"

#include <c10/util/Exception.h>

#include "core/validate.h"

namespace fused_amp::core {

namespace {

void check_states(const char* op, const char* name, at::TensorList list, bool needed,
                  const StepTensors& s, std::vector<at::Tensor>& out) {
  if (!needed) {
    TORCH_CHECK_VALUE(list.empty(), op, ": ", name, " must be empty here, got ", list.size(),
                      " tensors");
    return;
  }
  check_length(op, name, list.size(), s.params.size(), false);
  for (size_t i = 0; i < list.size(); ++i) check_partner(op, name, i, list[i], s.params[i], at::kFloat);
  out = list.vec();
}

}  // namespace

StepTensors validate_step(const char* op, at::TensorList params, at::TensorList grads,
                          const c10::List<std::optional<at::Tensor>>& master_params,
                          at::TensorList states_a, const char* states_a_name,
                          at::TensorList states_b, const char* states_b_name,
                          at::TensorList aux, const char* aux_name, bool need_aux,
                          at::TensorList steps, bool need_steps, double lr,
                          const std::optional<at::Tensor>& lr_tensor,
                          const std::optional<at::Tensor>& inv_scale,
                          const std::optional<at::Tensor>& found_inf) {
  StepTensors s;
  s.params = params.vec();
  s.lr = lr;
  if (params.empty()) return s;
  const at::Device device = params[0].device();
  check_list(op, "params", params, device, is_reduced_or_float, "float32, float16 and bfloat16");
  check_length(op, "grads", grads.size(), params.size(), false);
  for (size_t i = 0; i < grads.size(); ++i) {
    check_partner(op, "grads", i, grads[i], params[i], params[i].scalar_type());
  }
  s.grads = grads.vec();

  check_length(op, "master_params", master_params.size(), params.size(), true);
  s.masters.resize(params.size());
  for (size_t i = 0; i < master_params.size(); ++i) {
    const std::optional<at::Tensor> m = master_params[i];
    if (!m.has_value() || !m->defined()) continue;
    TORCH_CHECK_VALUE(params[i].scalar_type() != at::kFloat, op, ": master_params[", i,
                      "] is given but params[", i, "] is float32, which is updated in place");
    check_partner(op, "master_params", i, *m, params[i], at::kFloat);
    s.masters[i] = *m;
  }
  check_states(op, states_a_name, states_a, states_a_name != nullptr, s, s.states_a);
  check_states(op, states_b_name, states_b, states_b_name != nullptr, s, s.states_b);
  check_states(op, aux_name, aux, need_aux, s, s.aux);
  if (need_steps) {
    check_length(op, "steps", steps.size(), params.size(), false);
    for (size_t i = 0; i < steps.size(); ++i) {
      check_scalar(op, ("steps[" + std::to_string(i) + "]").c_str(), steps[i], device);
    }
    s.steps = steps.vec();
  } else {
    TORCH_CHECK_VALUE(steps.empty(), op, ": steps must be empty here, got ", steps.size());
  }
  if (lr_tensor.has_value() && lr_tensor->defined()) {
    const at::Tensor& t = *lr_tensor;
    TORCH_CHECK_VALUE(t.numel() == 1, op, ": lr_tensor must have one element, got shape ", t.sizes());
    TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, op,
                     ": lr_tensor must be float32 or float64, got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.device() == device || t.device().is_cpu(), op, ": lr_tensor is on ",
                      t.device(), " but params are on ", device);
    s.lr_tensor = t;
  }
  if (inv_scale.has_value() && inv_scale->defined()) {
    check_scalar(op, "inv_scale", *inv_scale, device);
    s.inv_scale = *inv_scale;
  }
  if (found_inf.has_value() && found_inf->defined()) {
    check_scalar(op, "found_inf", *found_inf, device);
    s.found_inf = *found_inf;
  }
  return s;
}

}  // namespace fused_amp::core
