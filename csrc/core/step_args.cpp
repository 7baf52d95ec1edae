#include "core/step_args.h"

#include <c10/util/Exception.h>

#include <string>

#include "core/validate.h"
#include "ops/quantize.h"

namespace fused_amp::core {

namespace {

// A state list: fp32 or bf16 tensors shaped like the params; with `first` (the op's first state
// list, already checked) each tensor has the dtype of the first list's for its param.
void check_states(const char* op, const char* name, at::TensorList list, at::TensorList params,
                  std::vector<at::Tensor>& out, const std::vector<at::Tensor>* first) {
  const bool follows_first = first && !first->empty();
  for (size_t i = 0; i < list.size(); ++i) {
    const at::ScalarType dtype = list[i].defined() ? list[i].scalar_type() : at::kFloat;
    TORCH_CHECK_TYPE(follows_first || dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kByte,
                     op, ": ", name, "[", i, "] has dtype ", dtype,
                     ", expected Float, BFloat16 or Byte (the state dtypes; Byte: 8-bit codes)");
    check_partner(op, name, i, list[i], params[i], follows_first ? (*first)[i].scalar_type() : dtype, true);
  }
  out = list.vec();
}

// The absmax of each param with 8-bit state: fp32, contiguous, (state rows, blocks); none for
// other params.
void check_absmaxes(const char* op, const c10::List<std::optional<at::Tensor>>& absmaxes, StepTensors& s) {
  const size_t n = s.params.size();
  check_length(op, "state_absmaxes", absmaxes.size(), n, true);
  int64_t rows = 0;
  for (const auto& list : s.states) rows += !list.empty();
  s.absmaxes.resize(absmaxes.empty() ? 0 : n);
  for (size_t i = 0; i < n; ++i) {
    const std::optional<at::Tensor> a = absmaxes.empty() ? std::nullopt : absmaxes[i];
    const bool given = a.has_value() && a->defined();
    const bool quantized = s.state_dtype(i) == at::kByte;
    if (rows == 0) {
      TORCH_CHECK_VALUE(!given, op, ": state_absmaxes[", i, "] is given but the step keeps no state");
      continue;
    }
    TORCH_CHECK_VALUE(given == quantized, op, ": state_absmaxes[", i, "] ",
                      quantized ? "is missing: the state of params[" : "is given but the state of params[", i,
                      quantized ? "] is 8-bit codes" : "] is not 8-bit codes");
    if (!given) continue;
    const at::Tensor& t = *a;
    const int64_t blocks = ops::quant_blocks(s.params[i].numel());
    TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, op, ": state_absmaxes[", i, "] has dtype ",
                     t.scalar_type(), ", expected Float");
    TORCH_CHECK_VALUE(t.device() == s.params[i].device(), op, ": state_absmaxes[", i, "] is on ",
                      t.device(), " but params[", i, "] is on ", s.params[i].device());
    TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == rows && t.size(1) == blocks, op, ": state_absmaxes[",
                      i, "] has shape ", t.sizes(), ", expected [", rows, ", ", blocks,
                      "] (one row per state, one absmax per block of ", ops::kQuantBlock, " elements)");
    TORCH_CHECK_VALUE(t.is_contiguous(), op, ": state_absmaxes[", i, "] must be contiguous");
    s.absmaxes[i] = t;
  }
}

void check_lr_tensor(const char* op, const at::Tensor& t, const at::Device& device) {
  TORCH_CHECK_VALUE(t.numel() == 1, op, ": lr_tensor must have one element, got shape ", t.sizes());
  TORCH_CHECK_TYPE(!t.is_complex() && t.scalar_type() != at::kBool, op,
                   ": lr_tensor must be a real number, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == device || t.device().is_cpu(), op, ": lr_tensor is on ",
                    t.device(), " but params are on ", device);
}

// Splits the kept states' list into their lists (s.states) and checks each.
void check_state_lists(const char* op, const StateLists& st, at::TensorList params, StepTensors& s) {
  const size_t n = params.size();
  int kept = 0;
  std::string names;
  for (int k = 0; k < st.count; ++k) {
    if (!(st.mask >> k & 1u)) continue;
    names += (kept++ ? ", " : "") + std::string(st.info[k].name);
  }
  TORCH_CHECK_VALUE(st.list.size() == kept * n, op, ": states has ", st.list.size(), " tensors, expected ",
                    kept, " lists of ", n, " (one tensor per param", kept ? ": " : "", names, ")");
  const std::vector<at::Tensor>* first = nullptr;
  int j = 0;
  for (int k = 0; k < st.count; ++k) {
    if (!(st.mask >> k & 1u)) continue;
    check_states(op, st.info[k].name, st.list.slice(j++ * n, n), params, s.states[k], first);
    first = &s.states[k];
  }
}

// What validate_step does once every check has passed: stages the tensors the kernels cannot
// walk as they are (core::Staging).
void stage_step(const char* op, StepTensors& s, Staging* staging) {
  for (size_t i = 0; i < s.params.size(); ++i) {
    s.params[i] = staging->dense(s.params[i], s.outputs.empty());  // (read only for their layout otherwise)
    const at::Tensor& param = s.params[i];
    s.grads[i] = staging->like(s.grads[i], param, s.write_grads);
    std::vector<std::vector<at::Tensor>*> partners{&s.masters, &s.outputs};
    for (auto& list : s.states) partners.push_back(&list);
    for (auto* list : partners) {
      if (list->empty() || !(*list)[i].defined()) continue;
      // 8-bit codes are not staged: their blocks follow their own memory order, which must be the
      // order in which the kernels walk the param
      const bool is_state = list != &s.masters && list != &s.outputs;
      TORCH_CHECK_VALUE(!is_state || !s.is_quantized(i) || (*list)[i].strides() == param.strides(), op,
                        ": the 8-bit state of params[", i, "] must be laid out as the param (strides ",
                        param.strides(), "), got strides ", (*list)[i].strides());
      (*list)[i] = staging->like((*list)[i], param, true);
    }
  }
}

}  // namespace

StepTensors validate_step(const char* op, at::TensorList params, at::TensorList grads,
                          const c10::List<std::optional<at::Tensor>>& master_params, const StateLists& states,
                          const c10::List<std::optional<at::Tensor>>& state_absmaxes,
                          at::TensorList steps, bool steps_required, at::TensorList scalars,
                          const char* scalar_key, at::TensorList outputs, bool writes_output, double lr,
                          const std::optional<at::Tensor>& lr_tensor,
                          const std::optional<at::Tensor>& inv_scale,
                          const std::optional<at::Tensor>& found_inf,
                          const std::optional<at::Tensor>& grad_norm,
                          std::optional<double> max_grad_norm,
                          std::optional<int64_t> rounding_seed, bool stochastic_codes,
                          bool unscale_grads, Staging* staging) {
  StepTensors s;
  s.lr = lr;
  check_length(op, "grads", grads.size(), params.size(), false);
  check_length(op, "master_params", master_params.size(), params.size(), true);
  if (params.empty()) {  // nothing to update; the other lists must be empty too
    TORCH_CHECK_VALUE(states.list.empty(), op, ": states has ", states.list.size(), " tensors but params has 0");
    check_length(op, "state_absmaxes", state_absmaxes.size(), 0, true);
    TORCH_CHECK_VALUE(steps.empty(), op, ": steps has ", steps.size(), " tensors but params has 0");
    TORCH_CHECK_VALUE(scalars.empty(), op, ": scalar_states has ", scalars.size(), " tensors but params has 0");
    TORCH_CHECK_VALUE(outputs.empty(), op, ": outputs has ", outputs.size(), " tensors but params has 0");
    return s;
  }
  const at::Device device = params[0].device();
  if (inv_scale.has_value() && inv_scale->defined()) {
    check_scalar(op, "inv_scale", *inv_scale, device);
    s.inv_scale = *inv_scale;
  }
  if (found_inf.has_value() && found_inf->defined()) {
    check_scalar(op, "found_inf", *found_inf, device);
    s.found_inf = *found_inf;
  }
  if (lr_tensor.has_value() && lr_tensor->defined()) {
    check_lr_tensor(op, *lr_tensor, device);
    s.lr_tensor = *lr_tensor;
  }
  const bool has_norm = grad_norm.has_value() && grad_norm->defined();
  TORCH_CHECK_VALUE(has_norm == max_grad_norm.has_value(), op,
                    ": grad_norm and max_grad_norm go together (clipping needs both)");
  if (has_norm) {
    check_scalar(op, "grad_norm", *grad_norm, device);
    s.grad_norm = *grad_norm;
    s.max_grad_norm = *max_grad_norm;
  }
  TORCH_CHECK_VALUE(!stochastic_codes || rounding_seed.has_value(), op,
                    ": stochastic_codes=True rounds 8-bit codes with rounding_seed, which is None");
  s.rounding_seed = rounding_seed;
  s.stochastic_codes = stochastic_codes;
  s.write_grads = unscale_grads && (s.inv_scale.has_value() || has_norm);
  check_list(op, "params", params, device, is_reduced_or_float, "float32, float16 and bfloat16",
             true);
  for (size_t i = 0; i < grads.size(); ++i) {
    check_partner(op, "grads", i, grads[i], params[i], params[i].scalar_type(), s.write_grads);
  }
  if (s.write_grads) check_distinct(op, "grads", grads);
  s.params = params.vec();
  s.grads = grads.vec();
  s.masters.resize(params.size());
  for (size_t i = 0; i < master_params.size(); ++i) {
    const std::optional<at::Tensor> m = master_params[i];
    if (!m.has_value() || !m->defined()) continue;
    TORCH_CHECK_VALUE(!writes_output, op, ": master_params[", i, "] is given but the step writes no param "
                      "(its result goes to outputs)");
    TORCH_CHECK_VALUE(params[i].scalar_type() != at::kFloat, op, ": master_params[", i,
                      "] is given but params[", i, "] is float32, which is updated in place");
    // an int16 or uint8 master is the remainder of a bf16 param (ops/rounding.h)
    const at::ScalarType dtype = m->scalar_type();
    const bool remainder = dtype == at::kShort || dtype == at::kByte;
    TORCH_CHECK_TYPE(!remainder || params[i].scalar_type() == at::kBFloat16, op, ": master_params[",
                     i, "] is ", dtype == at::kShort ? "an int16" : "a uint8", " remainder but params[", i,
                     "] is ", params[i].scalar_type(), "; remainders need bfloat16 params");
    check_partner(op, "master_params", i, *m, params[i], remainder ? dtype : at::kFloat, true);
    s.masters[i] = *m;
  }
  check_state_lists(op, states, params, s);
  check_absmaxes(op, state_absmaxes, s);
  if (steps_required || !steps.empty()) {
    check_length(op, "steps", steps.size(), params.size(), false);
    for (size_t i = 0; i < steps.size(); ++i) {
      check_scalar(op, ("steps[" + std::to_string(i) + "]").c_str(), steps[i], device);
    }
    s.steps = steps.vec();
  }
  if (scalar_key) {
    check_length(op, "scalar_states", scalars.size(), params.size(), false);
    for (size_t i = 0; i < scalars.size(); ++i) {
      check_scalar(op, ("scalar_states[" + std::to_string(i) + "] (" + scalar_key + ")").c_str(), scalars[i], device);
    }
    check_distinct(op, "scalar_states", scalars);
    s.scalars = scalars.vec();
  } else {
    TORCH_CHECK_VALUE(scalars.empty(), op, ": scalar_states must be empty: the optimizer keeps no scalar state, got ",
                      scalars.size(), " tensors");
  }
  if (writes_output) {
    check_length(op, "outputs", outputs.size(), params.size(), false);
    for (size_t i = 0; i < outputs.size(); ++i) check_partner(op, "outputs", i, outputs[i], params[i], at::kBFloat16, true);
    check_distinct(op, "outputs", outputs);
    s.outputs = outputs.vec();
  } else {
    TORCH_CHECK_VALUE(outputs.empty(), op, ": outputs must be empty: the step writes the params, got ",
                      outputs.size(), " tensors");
  }
  if (staging) stage_step(op, s, staging);
  return s;
}


}  // namespace fused_amp::core
