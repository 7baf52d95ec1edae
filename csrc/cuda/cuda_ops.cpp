// CUDA implementations: validate (the same checks as on the CPU), group tensors by dtype, turn
// them into raw pointers and launch on the current stream. Nothing here reads device memory,
// so no op syncs with the host and all of them can be captured in a CUDA graph.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "cuda/launch.h"
#include "ops_impl.h"

namespace fused_amp::cuda {

namespace {

Dtype dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return Dtype::Float;
    case at::kHalf: return Dtype::Half;
    case at::kBFloat16: return Dtype::BFloat16;
    case at::kDouble: return Dtype::Double;
    default: TORCH_INTERNAL_ASSERT(false, "dtype passed validation but has no kernel");
  }
}

void* ptr_or_null(const std::vector<at::Tensor>& list, size_t i) {
  return list.empty() || !list[i].defined() ? nullptr : list[i].data_ptr();
}

TensorPtrs ptrs_of(std::initializer_list<void*> ps, int64_t numel) {
  TensorPtrs t{};
  int k = 0;
  for (void* p : ps) t.p[k++] = p;
  t.numel = numel;
  return t;
}

float* float_ptr(const std::optional<at::Tensor>& t) {
  return t ? t->data_ptr<float>() : nullptr;
}

// The lr and scaler tensors an optimizer kernel reads. A CPU lr is read here (no device sync);
// a float64 device lr is converted on the device.
struct Scalars {
  StepScalars s;
  at::Tensor lr_keep_alive;
};

Scalars scalars_of(const core::StepTensors& st) {
  Scalars r{{st.lr, nullptr, float_ptr(st.inv_scale), float_ptr(st.found_inf), st.write_grads,
             float_ptr(st.grad_norm), static_cast<float>(st.max_grad_norm),
             st.rounding_seed.has_value(), st.rounding_seed.value_or(0), st.stochastic_codes},
            {}};
  if (st.lr_tensor) {
    if (st.lr_tensor->device().is_cpu()) {
      r.s.lr = st.lr_tensor->item<double>();
    } else {
      r.lr_keep_alive = st.lr_tensor->to(at::kFloat);
      r.s.lr_ptr = r.lr_keep_alive.data_ptr<float>();
    }
  }
  return r;
}

// The tensors of unscale_ and grad_norm_, grouped by dtype (`ptrs(i)`: the pointers of tensor
// i), and `launch(dtype, list)` for each group, in a fixed dtype order.
template <class Ptrs, class Launch>
void per_dtype(at::TensorList tensors, Ptrs&& ptrs, Launch&& launch) {
  std::map<int, std::vector<TensorPtrs>> by_dtype;
  for (size_t i = 0; i < tensors.size(); ++i) {
    by_dtype[static_cast<int>(tensors[i].scalar_type())].push_back(ptrs(i));
  }
  for (const auto& [dtype, list] : by_dtype) launch(dtype_of(static_cast<at::ScalarType>(dtype)), list);
}

// The pointers of param i in launch.h's StepList order, for an optimizer with `states` states
// and `scalars` (0 or 1) scalar states; then the absmaxes (8-bit state), the amax slot and the
// fp8 weight's codes, scale and scale's inverse.
TensorPtrs step_ptrs(const core::StepTensors& st, size_t i, int states, int scalars, void* amax_slot) {
  TensorPtrs t{};
  t.p[kParam] = st.params[i].data_ptr();
  t.p[kGrad] = st.grads[i].data_ptr();
  t.p[kMasterList] = st.outputs.empty() ? ptr_or_null(st.masters, i) : st.outputs[i].data_ptr();
  for (int k = 0; k < states; ++k) t.p[kFirstState + k] = ptr_or_null(st.states[k], i);
  t.p[step_list(states)] = ptr_or_null(st.steps, i);
  if (scalars) t.p[step_list(states) + 1] = st.scalars[i].data_ptr();
  t.p[step_lists(states, scalars)] = ptr_or_null(st.absmaxes, i);
  t.p[amax_list(states, scalars, st.is_quantized(i))] = amax_slot;
  if (!st.float8_weights.empty() && st.float8_weights[i].defined()) {
    const int float8 = float8_list(states, scalars, st.is_quantized(i));
    t.p[float8] = st.float8_weights[i].data_ptr();
    if (st.is_mx(i)) {
      t.p[float8 + 2] = st.float8_scales[i].data_ptr();
    } else {
      t.p[float8 + 1] = st.float8_scales[i].data_ptr();
      t.p[float8 + 2] = ptr_or_null(st.float8_scale_invs, i);
    }
  }
  t.numel = st.params[i].numel();
  return t;
}

}  // namespace

void Device::unscale(at::TensorList tensors, const at::Tensor& found_inf, const at::Tensor* inv_scale) {
  const c10::cuda::CUDAGuard guard(found_inf.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  per_dtype(
      tensors, [&](size_t i) { return ptrs_of({tensors[i].data_ptr()}, tensors[i].numel()); },
      [&](Dtype dtype, const std::vector<TensorPtrs>& list) {
        cuda::unscale(dtype, list, found_inf.data_ptr<float>(),
                      inv_scale ? inv_scale->data_ptr<float>() : nullptr, stream);
      });
}

void Device::grad_norm(at::TensorList tensors, const at::Tensor& found_inf, const at::Tensor& norm,
                       const at::Tensor* inv_scale, ops::NormKind kind) {
  const c10::cuda::CUDAGuard guard(found_inf.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // tensor i's slots in `partials` start at first_slot[i], in tensor order
  std::vector<int64_t> first_slot(tensors.size());
  int64_t count = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    first_slot[i] = count;
    count += norm_chunks(tensors[i].numel());
  }
  const at::Tensor partials = at::empty({std::max<int64_t>(count, 1)}, found_inf.options().dtype(at::kDouble));
  double* slots = partials.data_ptr<double>();
  per_dtype(
      tensors,
      [&](size_t i) { return ptrs_of({tensors[i].data_ptr(), slots + first_slot[i]}, tensors[i].numel()); },
      [&](Dtype dtype, const std::vector<TensorPtrs>& list) {
        grad_norm_partials(dtype, list, found_inf.data_ptr<float>(),
                           inv_scale ? inv_scale->data_ptr<float>() : nullptr, kind, stream);
      });
  grad_norm_total(slots, count, norm.data_ptr<float>(), kind, stream);
}

void Device::update_scale(const core::ScaleTensors& t, const ops::ScaleUpdateArgs& args) {
  const c10::cuda::CUDAGuard guard(t.scale.device());
  cuda::update_scale(t.scale.data_ptr<float>(), t.growth_tracker.data_ptr<int>(),
                     t.hysteresis_tracker ? t.hysteresis_tracker->data_ptr<int>() : nullptr,
                     t.found_inf.data_ptr<float>(), args, c10::cuda::getCurrentCUDAStream());
}

void Device::delayed_scale_update(const core::DelayedScalingTensors& t, const ops::DelayedScalingArgs& args) {
  const c10::cuda::CUDAGuard guard(t.histories[0].device());
  float* reduced = t.reduced ? t.reduced->data_ptr<float>() : nullptr;
  std::vector<TensorPtrs> tensors;
  for (size_t i = 0; i < t.histories.size(); ++i) {
    const int64_t columns = t.histories[i].size(1);
    tensors.push_back(ptrs_of({t.histories[i].data_ptr(), t.scales[i].data_ptr(), t.scale_invs[i].data_ptr(), reduced},
                              columns));
    if (reduced) reduced += columns;
  }
  cuda::delayed_scale_update(tensors, t.histories[0].size(0), args, c10::cuda::getCurrentCUDAStream());
}

// One optimizer step on the current stream: params grouped by kind (param dtype, master kind,
// state dtype), one launch sequence per group, then the step counts (those that exist)
// incremented unless found_inf says overflow. The weight amax, when asked for, is maxed into
// zeroed slots and goes to weight_amax unless found_inf says overflow (no host sync either way).
void Device::step(const core::StepArgs& a) {
  const core::StepTensors& st = a.tensors;
  int states = 0, scalars = 0;
  Optimizers::at(a.optimizer, [&]<class Opt>() {
    states = Opt::kStates;
    scalars = Opt::kScalarKey != nullptr;
  });
  const c10::cuda::CUDAGuard guard(st.params[0].device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const Scalars sc = scalars_of(st);
  const at::Tensor amax_slots = st.weight_amax ? at::zeros({static_cast<int64_t>(st.params.size())},
                                                            st.weight_amax->options().dtype(at::kInt))
                                               : at::Tensor();
  std::map<std::tuple<Dtype, MasterKind, StateKind>, std::vector<TensorPtrs>> groups;
  for (size_t i = 0; i < st.params.size(); ++i) {
    void* const slot = st.weight_amax ? amax_slots.data_ptr<int>() + i : nullptr;
    groups[{dtype_of(st.params[i].scalar_type()), st.master_kind(i), st.state_kind(i)}]
        .push_back(step_ptrs(st, i, states, scalars, slot));
  }
  for (const auto& [key, list] : groups) {
    const auto [param, master, state] = key;
    cuda::step(a.optimizer, StepKind{param, master, state}, list, a.hyper.data(), sc.s, stream);
  }
  if (!st.steps.empty()) {
    std::vector<TensorPtrs> steps;
    for (const auto& step : st.steps) steps.push_back(ptrs_of({step.data_ptr()}, 1));
    increment_steps(steps, float_ptr(st.found_inf), stream);
  }
  if (st.weight_amax) {  // the slots hold magnitude bits: as fp32, the amaxes themselves
    const at::Tensor fresh = amax_slots.view(at::kFloat);
    st.weight_amax->copy_(st.found_inf ? at::where(at::ne(*st.found_inf, 0), *st.weight_amax, fresh) : fresh);
  }
}

}  // namespace fused_amp::cuda

TORCH_LIBRARY_IMPL(fused_amp, CUDA, m) { fused_amp::register_entries<fused_amp::cuda::Device>(m); }
