#pragma once
// The arguments of one optimizer step (step_), validated once for both devices.
#include <ATen/core/Tensor.h>
#include <ATen/core/List.h>

#include <optional>
#include <vector>

#include "core/storage_dtypes.h"
#include "core/validate.h"
#include "ops/optimizer.h"
#include "ops/update_scale.h"

namespace fused_amp::core {

// MX block scales: e8m0 codes, as float8_e8m0fnu or their bytes as uint8 (torch.compile's
// inductor cannot functionalize a written float8_e8m0fnu tensor, but takes a uint8 view of one).
inline bool is_mx_scale(const at::Tensor& t) {
  return t.defined() && (t.scalar_type() == at::kFloat8_e8m0fnu || t.scalar_type() == at::kByte);
}

struct StepTensors {
  // masters[i] is undefined where params[i] is updated in place, else a tensor of one of
  // storage_kinds.h's master kinds (its dtype says which).
  std::vector<at::Tensor> params, grads, masters, steps;
  // the optimizer's per-tensor scalar state (ops::Elementwise::kScalarKey), one-element fp32
  // tensors on the params' device; empty for an optimizer that keeps none
  std::vector<at::Tensor> scalars;
  // states[k]: the optimizer's state k of every param (ops/optimizer.h), empty where the step
  // keeps no such state. A param's state tensors are all of one kind (storage_kinds.h).
  std::vector<at::Tensor> states[ops::kMaxStates];
  // With codes (8- or 4-bit state, ops/quantize.h, ops/quantize4.h), absmaxes[i] holds the fp32 absmax of every
  // block of param i's states: one row per state kept, in state order; undefined for other state.
  std::vector<at::Tensor> absmaxes;
  // An optimizer that writes no param (ops::Elementwise::kWritesOutput) writes these instead:
  // bf16, shaped like the params; empty for every other optimizer.
  std::vector<at::Tensor> outputs;
  std::optional<at::Tensor> lr_tensor, inv_scale, found_inf;
  // With grad_norm (the total norm of the unscaled grads) the grads are clipped in the step:
  // multiplied by ops::clip_coef(grad_norm, max_grad_norm) on top of inv_scale.
  std::optional<at::Tensor> grad_norm;
  double max_grad_norm = 0.0;
  // bf16 state and 24-bit masters round stochastically with this seed (ops::rounding_key), else
  // to nearest even
  std::optional<int64_t> rounding_seed;
  // 8-bit codes round stochastically too (with rounding_seed, which is then given)
  bool stochastic_codes = false;
  double lr = 0.0;
  // leave the grads as the step used them (unscaled, clipped), as torch's recipe leaves them
  bool write_grads = false;
  // fp8 scaling: the step writes each param's amax (the largest |element| it wrote, as fp32)
  // here, one element per param; a skipped step (found_inf) leaves it as it was
  std::optional<at::Tensor> weight_amax;
  // fp8 weights: where float8_weights[i] is defined (float8_e4m3fn, shaped like params[i]) the
  // step writes there the e4m3 cast of the param it wrote times float8_scales[i] (one fp32
  // element, ops/float8.h) and, where float8_scale_invs[i] is defined, 1 / float8_scales[i]
  // there: the copy's dequantization scale as of its cast (delayed scaling moves the scale on
  // before the copy is next cast). Where float8_scales[i] is float8_e8m0fnu (or its bytes, uint8)
  // instead, the copy is MX (MXFP8): the step writes there the e8m0 scale of each block of 32
  // along the last dim and casts the block by it. Empty lists where no copy is asked for.
  std::vector<at::Tensor> float8_weights, float8_scales, float8_scale_invs;
  bool is_mx(size_t i) const { return !float8_scales.empty() && is_mx_scale(float8_scales[i]); }

  // Where param i's fp32 value lives (storage_kinds.h): None where it is updated in place.
  MasterKind master_kind(size_t i) const {
    return masters.empty() || !masters[i].defined() ? MasterKind::None : master_kind_of(masters[i].scalar_type());
  }
  // How each param's state is held (all of it one way), decided once by validation from the first
  // state list kept (storage_dtypes.h); empty where the step keeps no state.
  std::vector<StateKind> state_kinds;
  // fp32 when it has none (SGD without momentum)
  StateKind state_kind(size_t i) const { return state_kinds.empty() ? StateKind::Fp32 : state_kinds[i]; }
  bool is_quantized(size_t i) const { return !absmaxes.empty() && absmaxes[i].defined(); }
};

// The states of an optimizer as the step op takes them: `list` holds the states kept (bit k of
// `mask`: state k, whose list name is info[k].name), one after another, each one tensor per param.
struct StateLists {
  at::TensorList list;
  const ops::StateInfo* info;
  int count;
  unsigned mask;
};

// The arguments of step_ that validate_step checks (register.cpp's schema), with what the
// optimizer's descriptor says of them: `steps` must be given when `steps_required`, else may
// be; `scalars` (one-element fp32 tensors, one per param) when `scalar_key` names the
// optimizer's scalar state, else must be empty. With `writes_output` the params are read for
// their shapes and layouts only, `outputs` (bf16, shaped like them) are written and masters are
// refused; without, `outputs` must be empty. `master_params` and `state_absmaxes` are empty or
// hold one tensor per param, an empty one where the param has none. Filled by name
// (ops_impl.h): a member left out keeps its default here.
struct StepInputs {
  at::TensorList params, grads;
  at::TensorList master_params;
  StateLists states{};
  at::TensorList state_absmaxes;
  at::TensorList steps;
  bool steps_required = false;
  at::TensorList scalars;
  const char* scalar_key = nullptr;
  at::TensorList outputs;
  bool writes_output = false;
  double lr = 0.0;
  std::optional<at::Tensor> lr_tensor, inv_scale, found_inf, grad_norm;
  double max_grad_norm = 0.0;  // (with grad_norm)
  std::optional<int64_t> rounding_seed;
  bool stochastic_codes = false, unscale_grads = true;
};

// Checks every list against params (length, device, shape, dtype) and the scalars (lr_tensor,
// inv_scale, found_inf, grad_norm) and, for codes, their absmaxes (one row per state kept,
// one column per block); raises before anything is touched. With `staging`, tensors whose
// layout the kernels cannot walk are replaced by staged copies (core::Staging); without, only
// checks.
StepTensors validate_step(const char* op, const StepInputs& in, Staging* staging);

// The fp8 weights of step_: weights[k] is the copy of params[indices[k]] (float8_e4m3fn, shaped
// as it), scales[k] its scale and scale_invs[k] (or none at all) where its inverse goes (one fp32
// element each, on the params' device); or scales[k] its MX block scales, which the step writes,
// and scale_invs[k] empty.
struct Float8Inputs {
  at::TensorList weights, scales, scale_invs;
  c10::ArrayRef<int64_t> indices;
};

// step_'s read-only scalar tensors (its `scalars`: lr_tensor, inv_scale, found_inf, grad_norm, in
// that order, each None where not given; or none at all) and its `rounding` (empty: to nearest;
// or the stochastic rounding's seed and whether 8-bit codes take it too), checked for their form.
struct StepScalars {
  std::optional<at::Tensor> lr_tensor, inv_scale, found_inf, grad_norm;
  std::optional<int64_t> rounding_seed;
  bool stochastic_codes = false;
};
StepScalars step_scalars(const char* op, const c10::List<std::optional<at::Tensor>>& scalars,
                         c10::ArrayRef<int64_t> rounding);

// What step_ writes besides the params (its `epilogues`, laid out as `epilogue_layout` says:
// [whether weight_amax is given, whether float8_scale_invs are, then the param of each fp8 copy]):
// weight_amax first where given, then the copies' float8_weights, float8_scales and, where given,
// float8_scale_invs, a list each, one entry per copy. Empty lists: none of them.
struct Epilogues {
  std::optional<at::Tensor> weight_amax;
  Float8Inputs float8;
};
Epilogues epilogues_of(const char* op, at::TensorList epilogues, c10::ArrayRef<int64_t> layout);

// Checks them (one copy per param at most; only for an optimizer that writes its params, not
// `writes_output`) and puts them into `s` by param; copies in another layout than their param
// are staged as step_'s other tensors are.
void check_float8_weights(const char* op, const Float8Inputs& in, bool writes_output, StepTensors& s,
                          Staging* staging);

// The validated arguments of step_, as the devices take them (ops_impl.h): the optimizer's name
// and its hyperparameter list, in the order of its descriptor's kHyperFields.
struct StepArgs {
  int optimizer;  // its index in Optimizers (optimizers.h): the name is looked up once per step
  StepTensors tensors;
  std::vector<double> hyper;
};

}  // namespace fused_amp::core
