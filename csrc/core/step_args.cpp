#include "core/step_args.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <map>
#include <string>

#include "core/validate.h"
#include "ops/float8.h"

namespace fused_amp::core {

namespace {

// Codes of fewer than 8 bits (4-bit codes): packed in the param's memory order, several to a byte
// (ops/quantize4.h); contiguous, so they cannot overlap themselves.
void check_packed_codes(const char* op, const char* name, size_t i, const at::Tensor& t, const at::Tensor& param,
                        int bits) {
  const int64_t bytes = packed_code_bytes(param.numel(), bits);
  TORCH_CHECK_VALUE(t.device() == param.device(), op, ": ", name, "[", i, "] is on ", t.device(),
                    " but params[", i, "] is on ", param.device());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.numel() == bytes && t.is_contiguous(), op, ": ", name, "[", i, "] holds ",
                    bits, "-bit codes of params[", i, "] (", param.numel(), " elements): expected a contiguous "
                    "1-D uint8 tensor of ", bytes, " bytes, got shape ", t.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == at::kByte, op, ": ", name, "[", i, "] has dtype ", t.scalar_type(),
                   ", expected Byte (the ", bits, "-bit codes of the first state list)");
}

// A state list: tensors of a state kind (storage_kinds.h) for the params. The op's first state
// list decides each param's kind (`kinds`); with `first` (that list, already checked) each tensor
// is of the first list's kind for its param.
void check_states(const char* op, const char* name, at::TensorList list, at::TensorList params,
                  std::vector<at::Tensor>& out, const std::vector<at::Tensor>* first, std::vector<StateKind>& kinds) {
  const bool follows_first = first && !first->empty();
  for (size_t i = 0; i < list.size(); ++i) {
    if (!follows_first) {
      const bool known = list[i].defined() && state_kind_of(list[i], params[i], &kinds[i]);
      TORCH_CHECK_TYPE(known || !list[i].defined(), op, ": ", name, "[", i, "] has dtype ", list[i].scalar_type(),
                       ", expected ", state_dtype_names(), " (the state dtypes; Byte: 8- or 4-bit codes)");
    }
    const int bits = state_storage(kinds[i]).bits;
    if (bits < 8 && list[i].defined()) {
      check_packed_codes(op, name, i, list[i], params[i], bits);
    } else {
      const at::ScalarType dtype = follows_first ? (*first)[i].scalar_type()
                                                 : (list[i].defined() ? list[i].scalar_type() : at::kFloat);
      check_partner(op, name, i, list[i], params[i], dtype, true);
    }
  }
  out = list.vec();
}

// Whether a tensor of a list whose entries may be absent (master_params, state_absmaxes) is
// given: a list of tensors holds no None (torch.compile's functionalization refuses written lists
// with Nones), so an empty tensor stands for none.
bool given_tensor(const at::Tensor& t) { return t.defined() && t.numel() > 0; }

// The absmax of each param with 8- or 4-bit state: fp32, contiguous, (state rows, blocks); none
// for other params.
void check_absmaxes(const char* op, at::TensorList absmaxes, StepTensors& s) {
  const size_t n = s.params.size();
  check_length(op, "state_absmaxes", absmaxes.size(), n, true);
  int64_t rows = 0;
  for (const auto& list : s.states) rows += !list.empty();
  s.absmaxes.resize(absmaxes.empty() ? 0 : n);
  for (size_t i = 0; i < n; ++i) {
    // (the absmaxes of an empty param's codes are empty too: given or not, alike)
    const StorageKind& kind = state_storage(s.state_kind(i));
    const bool quantized = kind.block > 0 && s.params[i].numel() > 0;
    const bool given = !absmaxes.empty() && given_tensor(absmaxes[i]) && s.params[i].numel() > 0;
    if (rows == 0) {
      TORCH_CHECK_VALUE(!given, op, ": state_absmaxes[", i, "] is given but the step keeps no state");
      continue;
    }
    TORCH_CHECK_VALUE(given == quantized, op, ": state_absmaxes[", i, "] ",
                      quantized ? "is missing: the state of params[" : "is given but the state of params[", i,
                      quantized ? "] is codes" : "] is not codes");
    if (!given) continue;
    const at::Tensor& t = absmaxes[i];
    const int64_t blocks = (s.params[i].numel() + kind.block - 1) / kind.block;
    TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, op, ": state_absmaxes[", i, "] has dtype ",
                     t.scalar_type(), ", expected Float");
    TORCH_CHECK_VALUE(t.device() == s.params[i].device(), op, ": state_absmaxes[", i, "] is on ",
                      t.device(), " but params[", i, "] is on ", s.params[i].device());
    TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == rows && t.size(1) == blocks, op, ": state_absmaxes[",
                      i, "] has shape ", t.sizes(), ", expected [", rows, ", ", blocks,
                      "] (one row per state, one absmax per block of ", kind.block, " elements)");
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
  for (int k = 0; k < st.count; ++k) kept += st.mask >> k & 1u;
  if (st.list.size() != kept * n) {  // (the names for the message only)
    std::string names;
    for (int k = 0; k < st.count; ++k) {
      if (st.mask >> k & 1u) names += (names.empty() ? "" : ", ") + std::string(st.info[k].name);
    }
    TORCH_CHECK_VALUE(false, op, ": states has ", st.list.size(), " tensors, expected ", kept, " lists of ", n,
                      " (one tensor per param", kept ? ": " : "", names, ")");
  }
  const std::vector<at::Tensor>* first = nullptr;
  if (kept > 0) s.state_kinds.assign(n, StateKind::Fp32);
  int j = 0;
  for (int k = 0; k < st.count; ++k) {
    if (!(st.mask >> k & 1u)) continue;
    check_states(op, st.info[k].name, st.list.slice(j++ * n, n), params, s.states[k], first, s.state_kinds);
    first = &s.states[k];
  }
}

// 8-bit codes are not staged: their blocks follow their own memory order, which must be the
// order in which the kernels walk the param (its own, or its staged copy's where it is not dense).
void check_code_layouts(const char* op, const StepTensors& s) {
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (!s.is_quantized(i) || state_storage(s.state_kind(i)).bits < 8) continue;  // (packed codes are 1-D)
    const at::Tensor& param = s.params[i];
    std::vector<int64_t> walked = param.strides().vec();
    if (!param.is_non_overlapping_and_dense()) {  // (its staged copy is contiguous)
      int64_t stride = 1;
      for (int64_t d = param.dim() - 1; d >= 0; --d) {
        walked[d] = stride;
        stride *= std::max<int64_t>(param.size(d), 1);
      }
    }
    for (const auto& list : s.states) {
      if (list.empty()) continue;
      TORCH_CHECK_VALUE(list[i].strides() == at::IntArrayRef(walked), op, ": the 8-bit state of params[", i,
                        "] must be laid out as the param (strides ", at::IntArrayRef(walked), "), got strides ",
                        list[i].strides());
    }
  }
}

// What validate_step does once every check has passed: stages the tensors the kernels cannot
// walk as they are (core::Staging).
void stage_step(const char* op, StepTensors& s, Staging* staging) {
  for (size_t i = 0; i < s.params.size(); ++i) {
    s.params[i] = staging->dense(s.params[i], s.outputs.empty());  // (read only for their layout otherwise)
    const at::Tensor& param = s.params[i];
    s.grads[i] = staging->like(s.grads[i], param, s.write_grads);
    std::array<std::vector<at::Tensor>*, 2 + ops::kMaxStates> partners{&s.masters, &s.outputs};
    for (int k = 0; k < ops::kMaxStates; ++k) partners[2 + k] = &s.states[k];
    for (auto* list : partners) {
      if (list->empty() || !(*list)[i].defined()) continue;
      const bool is_state = list != &s.masters && list != &s.outputs;
      if (is_state && s.is_quantized(i)) continue;  // (laid out as the param: check_code_layouts)
      (*list)[i] = staging->like((*list)[i], param, true);
    }
  }
}

// The MX block scales of copy k (ops/float8.h): float8_e8m0fnu, one per block of kMxBlock
// along the last dim of params[i], which must be laid out in the order of its shape (contiguous,
// or staged so) so that its blocks are runs in memory. The step writes them.
void check_mx_scales(const char* op, size_t k, const at::Tensor& scales, const at::Tensor& param, int64_t i) {
  const std::string name = "float8_scales[" + std::to_string(k) + "]";
  TORCH_CHECK_VALUE(param.dim() > 0 && param.size(-1) % ops::kMxBlock == 0, op, ": ", name,
                    " are MX block scales (float8_e8m0fnu or uint8) but the last dim of params[", i, "] (shape ",
                    param.sizes(), ") is not a multiple of ", ops::kMxBlock);
  // (a param not dense is walked through a contiguous staged copy)
  TORCH_CHECK_VALUE(param.is_contiguous() || !param.is_non_overlapping_and_dense(), op, ": ", name,
                    " are MX block scales but params[", i, "] is laid out in another order than its shape's: its ",
                    "blocks of ", ops::kMxBlock, " run along its last dim");
  std::vector<int64_t> shape = param.sizes().vec();
  shape.back() /= ops::kMxBlock;
  TORCH_CHECK_VALUE(scales.sizes() == at::IntArrayRef(shape) && scales.is_contiguous(), op, ": ", name,
                    " has shape ", scales.sizes(), ", expected a contiguous ", at::IntArrayRef(shape),
                    " (one scale per block of ", ops::kMxBlock, " along the last dim of params[", i, "])");
  TORCH_CHECK_VALUE(scales.device() == param.device(), op, ": ", name, " is on ", scales.device(),
                    " but params[", i, "] is on ", param.device());
}

}  // namespace

StepTensors validate_step(const char* op, const StepInputs& in, Staging* staging) {
  StepTensors s;
  s.lr = in.lr;
  check_length(op, "grads", in.grads.size(), in.params.size(), false);
  check_length(op, "master_params", in.master_params.size(), in.params.size(), true);
  if (in.params.empty()) {  // nothing to update; the other lists must be empty too
    TORCH_CHECK_VALUE(in.states.list.empty(), op, ": states has ", in.states.list.size(), " tensors but params has 0");
    check_length(op, "state_absmaxes", in.state_absmaxes.size(), 0, true);
    TORCH_CHECK_VALUE(in.steps.empty(), op, ": steps has ", in.steps.size(), " tensors but params has 0");
    TORCH_CHECK_VALUE(in.scalars.empty(), op, ": scalar_states has ", in.scalars.size(), " tensors but params has 0");
    TORCH_CHECK_VALUE(in.outputs.empty(), op, ": outputs has ", in.outputs.size(), " tensors but params has 0");
    return s;
  }
  const at::Device device = in.params[0].device();
  if (in.inv_scale.has_value() && in.inv_scale->defined()) {
    check_scalar(op, "inv_scale", *in.inv_scale, device);
    s.inv_scale = *in.inv_scale;
  }
  if (in.found_inf.has_value() && in.found_inf->defined()) {
    check_scalar(op, "found_inf", *in.found_inf, device);
    s.found_inf = *in.found_inf;
  }
  if (in.lr_tensor.has_value() && in.lr_tensor->defined()) {
    check_lr_tensor(op, *in.lr_tensor, device);
    s.lr_tensor = *in.lr_tensor;
  }
  const bool has_norm = in.grad_norm.has_value() && in.grad_norm->defined();
  if (has_norm) {
    check_scalar(op, "grad_norm", *in.grad_norm, device);
    s.grad_norm = *in.grad_norm;
    s.max_grad_norm = in.max_grad_norm;
  }
  TORCH_CHECK_VALUE(!in.stochastic_codes || in.rounding_seed.has_value(), op,
                    ": stochastic_codes=True rounds 8-bit codes with rounding_seed, which is None");
  s.rounding_seed = in.rounding_seed;
  s.stochastic_codes = in.stochastic_codes;
  s.write_grads = in.unscale_grads && (s.inv_scale.has_value() || has_norm);
  check_list(op, "params", in.params, device, is_reduced_or_float, "float32, float16 and bfloat16",
             true);
  for (size_t i = 0; i < in.grads.size(); ++i) {
    check_partner(op, "grads", i, in.grads[i], in.params[i], in.params[i].scalar_type(), s.write_grads);
  }
  if (s.write_grads) check_distinct(op, "grads", in.grads);
  s.params = in.params.vec();
  s.grads = in.grads.vec();
  s.masters.resize(in.params.size());
  for (size_t i = 0; i < in.master_params.size(); ++i) {
    const at::Tensor& master = in.master_params[i];
    if (!given_tensor(master) || in.params[i].numel() == 0) continue;  // (an empty param's master does nothing)
    const at::Tensor* m = &master;
    TORCH_CHECK_VALUE(!in.writes_output, op, ": master_params[", i, "] is given but the step writes no param "
                      "(its result goes to outputs)");
    TORCH_CHECK_VALUE(in.params[i].scalar_type() != at::kFloat, op, ": master_params[", i,
                      "] is given but params[", i, "] is float32, which is updated in place");
    // a master kind that keeps the master's top half in a bf16 param needs one (storage_kinds.h)
    const StorageKind* kind = master_storage(master_kind_of(m->scalar_type()));
    TORCH_CHECK_TYPE(!kind || !kind->bf16_params || in.params[i].scalar_type() == at::kBFloat16, op,
                     ": master_params[", i, "] has dtype ", kind->dtype, ", a remainder (master_weights='",
                     kind->option, "'), but params[", i, "] is ", in.params[i].scalar_type(),
                     "; remainders need bfloat16 params");
    check_partner(op, "master_params", i, *m, in.params[i], kind ? m->scalar_type() : at::kFloat, true);
    s.masters[i] = *m;
  }
  check_state_lists(op, in.states, in.params, s);
  check_absmaxes(op, in.state_absmaxes, s);
  if (in.steps_required || !in.steps.empty()) {
    check_length(op, "steps", in.steps.size(), in.params.size(), false);
    for (size_t i = 0; i < in.steps.size(); ++i) {
      check_scalar(op, {"steps", i}, in.steps[i], device);
    }
    s.steps = in.steps.vec();
  }
  if (in.scalar_key) {
    check_length(op, "scalar_states", in.scalars.size(), in.params.size(), false);
    for (size_t i = 0; i < in.scalars.size(); ++i) {
      check_scalar(op, {"scalar_states", i, in.scalar_key}, in.scalars[i], device);
    }
    check_distinct(op, "scalar_states", in.scalars);
    s.scalars = in.scalars.vec();
  } else {
    TORCH_CHECK_VALUE(in.scalars.empty(), op, ": scalar_states must be empty: the optimizer keeps no scalar state, got ",
                      in.scalars.size(), " tensors");
  }
  if (in.writes_output) {
    check_length(op, "outputs", in.outputs.size(), in.params.size(), false);
    for (size_t i = 0; i < in.outputs.size(); ++i) {
      check_partner(op, "outputs", i, in.outputs[i], in.params[i], at::kBFloat16, true);
    }
    check_distinct(op, "outputs", in.outputs);
    s.outputs = in.outputs.vec();
  } else {
    TORCH_CHECK_VALUE(in.outputs.empty(), op, ": outputs must be empty: the step writes the params, got ",
                      in.outputs.size(), " tensors");
  }
  check_code_layouts(op, s);
  if (staging) stage_step(op, s, staging);
  return s;
}

StepScalars step_scalars(const char* op, const c10::List<std::optional<at::Tensor>>& scalars,
                         c10::ArrayRef<int64_t> rounding) {
  TORCH_CHECK_VALUE(scalars.empty() || scalars.size() == 4, op, ": scalars has ", scalars.size(),
                    " entries, expected 4 (lr_tensor, inv_scale, found_inf, grad_norm; None where not given) or none");
  TORCH_CHECK_VALUE(rounding.empty() || (rounding.size() == 2 && (rounding[1] == 0 || rounding[1] == 1)), op,
                    ": rounding is ", rounding, ", expected [] (to nearest) or [seed, 0 or 1] (stochastically with ",
                    "that seed; 1: 8-bit codes too)");
  StepScalars out;
  auto entry = [&](size_t k) -> std::optional<at::Tensor> {
    if (scalars.empty()) return std::nullopt;
    const std::optional<at::Tensor> t = scalars[k];
    return t.has_value() && t->defined() ? t : std::nullopt;
  };
  out.lr_tensor = entry(0);
  out.inv_scale = entry(1);
  out.found_inf = entry(2);
  out.grad_norm = entry(3);
  if (!rounding.empty()) {
    out.rounding_seed = rounding[0];
    out.stochastic_codes = rounding[1] == 1;
  }
  return out;
}

Epilogues epilogues_of(const char* op, at::TensorList epilogues, c10::ArrayRef<int64_t> layout) {
  Epilogues out;
  if (layout.empty()) {
    TORCH_CHECK_VALUE(epilogues.empty(), op, ": epilogues has ", epilogues.size(),
                      " tensors but epilogue_layout is empty (it says what they are)");
    return out;
  }
  TORCH_CHECK_VALUE(layout.size() >= 2 && (layout[0] == 0 || layout[0] == 1) && (layout[1] == 0 || layout[1] == 1),
                    op, ": epilogue_layout is ", layout, ", expected [weight_amax given (0 or 1), ",
                    "float8_scale_invs given (0 or 1), the param of each fp8 copy...]");
  const size_t amax = layout[0], copies = layout.size() - 2, lists = 2 + layout[1];
  TORCH_CHECK_VALUE(epilogues.size() == amax + copies * lists, op, ": epilogues has ", epilogues.size(),
                    " tensors, expected ", amax + copies * lists, " as epilogue_layout ", layout, " says (",
                    amax ? "weight_amax, then " : "", copies, " fp8 copies' float8_weights, float8_scales",
                    layout[1] ? " and float8_scale_invs" : "", ")");
  if (amax) out.weight_amax = epilogues[0];
  const at::TensorList copy_lists = epilogues.slice(amax);
  out.float8 = Float8Inputs{copy_lists.slice(0, copies), copy_lists.slice(copies, copies),
                            layout[1] ? copy_lists.slice(2 * copies, copies) : at::TensorList(), layout.slice(2)};
  return out;
}

void check_float8_weights(const char* op, const Float8Inputs& in, bool writes_output, StepTensors& s,
                          Staging* staging) {
  const size_t n = s.params.size(), m = in.weights.size();
  TORCH_CHECK_VALUE(in.scales.size() == m && in.indices.size() == m, op, ": float8_weights has ", m,
                    " tensors; float8_scales (", in.scales.size(), ") and float8_indices (", in.indices.size(),
                    ") need as many");
  TORCH_CHECK_VALUE(in.scale_invs.empty() || in.scale_invs.size() == m, op, ": float8_scale_invs has ",
                    in.scale_invs.size(), " tensors but float8_weights has ", m, " (or pass none)");
  if (m == 0) return;
  TORCH_CHECK_VALUE(!writes_output, op, ": float8_weights are given but the step writes no param (its result goes ",
                    "to outputs)");
  s.float8_weights.assign(n, at::Tensor());
  s.float8_scales.assign(n, at::Tensor());
  if (!in.scale_invs.empty()) s.float8_scale_invs.assign(n, at::Tensor());
  std::map<const void*, size_t> mx_scales;  // (first element, k): written, so no two may share memory
  for (size_t k = 0; k < m; ++k) {
    const int64_t i = in.indices[k];
    const std::string at_k = "[" + std::to_string(k) + "]";
    TORCH_CHECK_VALUE(i >= 0 && i < static_cast<int64_t>(n), op, ": float8_indices", at_k, " is ", i,
                      ", not the index of a param (", n, " params)");
    TORCH_CHECK_VALUE(!s.float8_weights[i].defined(), op, ": float8_indices", at_k, " is ", i,
                      " again: a param has one copy at most");
    check_partner(op, "float8_weights", k, in.weights[k], s.params[i], at::kFloat8_e4m3fn, true, i);
    const bool mx = is_mx_scale(in.scales[k]);
    if (mx) {
      check_mx_scales(op, k, in.scales[k], s.params[i], i);
      const void* start = in.scales[k].numel() > 0 && !in.scales[k].is_meta() ? in.scales[k].data_ptr() : nullptr;
      const auto [at, inserted] = mx_scales.emplace(start, k);
      TORCH_CHECK_VALUE(!start || inserted, op, ": float8_scales[", at->second, "] and float8_scales", at_k,
                        " are the same memory; the step writes MX scales, so each tensor may appear once");
    } else {
      check_scalar(op, ("float8_scales" + at_k).c_str(), in.scales[k], s.params[i].device());
    }
    s.float8_weights[i] = staging ? staging->like(in.weights[k], s.params[i], true) : in.weights[k];
    s.float8_scales[i] = in.scales[k];
    if (in.scale_invs.empty()) continue;
    if (mx) {  // (a list of tensors has no None: an empty tensor stands for none)
      TORCH_CHECK_VALUE(in.scale_invs[k].numel() == 0, op, ": float8_scale_invs", at_k, " must be empty: ",
                        "float8_scales", at_k, " are MX block scales, which are their own dequantization scales");
      continue;
    }
    check_scalar(op, ("float8_scale_invs" + at_k).c_str(), in.scale_invs[k], s.params[i].device());
    TORCH_CHECK_VALUE(!in.scale_invs[k].is_alias_of(in.scales[k]), op, ": float8_scale_invs", at_k,
                      " shares memory with float8_scales", at_k, ", which the step reads while writing it");
    s.float8_scale_invs[i] = in.scale_invs[k];
  }
  check_distinct(op, "float8_scale_invs", in.scale_invs);
}

}  // namespace fused_amp::core
