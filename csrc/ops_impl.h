#pragma once
// The ops' entry points, written once: each validates its arguments (core/) and hands them to
// a device, which implements
//   static void unscale(at::TensorList, const at::Tensor& found_inf, const at::Tensor* inv_scale);
//       (inv_scale null: non_finite_check_)
//   static void grad_norm(at::TensorList, const at::Tensor& found_inf, const at::Tensor& norm,
//                         const at::Tensor* inv_scale, ops::NormKind kind);
//   static void update_scale(const core::ScaleTensors&, const ops::ScaleUpdateArgs&);
//   static void step(const core::StepArgs&);   (any optimizer of optimizers.h)
// register.cpp registers Entry<cpu::Device> for CPU, cuda/cuda_ops.cpp Entry<cuda::Device> for
// CUDA. Argument meanings: the schemas in register.cpp.
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <c10/util/StringUtil.h>

#include <iterator>
#include <optional>
#include <string>

#include "core/step_args.h"
#include "core/validate.h"
#include "optimizers.h"

namespace fused_amp {

// What every entry point does around the work: the ATen calls made inside (staging copies,
// reads of scalars) skip autograd and inference-mode checks, since the op itself was already
// admitted; torch accepts a found_inf that requires grad and inference tensors alike.
struct BelowAutograd {
  c10::impl::ExcludeDispatchKeyGuard guard{c10::autograd_dispatch_keyset_with_ADInplaceOrView};
};

// The version counters of what an optimizer step wrote. torch's for-loop and foreach optimizers
// bump them (their in-place ops do, in the ADInplaceOrView kernel, which these entries run
// below; its fused ones and its unscale op do not), and autograd relies on them: a param saved
// for backward and then stepped raises "modified by an inplace operation" instead of giving a
// wrong gradient. Bumped whenever the kernels ran, also when found_inf made them skip on the
// device (the host cannot know: a bump is conservative). Inference tensors have none.
inline void bump_versions(const at::Tensor& t) {
  if (t.defined() && !t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}
inline void bump_versions(at::TensorList tensors) {
  for (const at::Tensor& t : tensors) bump_versions(t);
}
// What every optimizer step writes: params (or outputs), masters, state, step counts, absmaxes;
// the grads when it leaves them unscaled.
inline void bump_step_versions(const core::StepTensors& s, at::TensorList params, at::TensorList grads,
                               at::TensorList masters, at::TensorList states, at::TensorList absmaxes,
                               at::TensorList steps, at::TensorList outputs) {
  bump_versions(outputs.empty() ? params : outputs);
  if (s.write_grads) bump_versions(grads);
  bump_versions(masters);
  bump_versions(states);
  bump_versions(absmaxes);
  bump_versions(steps);
}

// The optimizers' names, for the message that refuses another.
inline std::string optimizer_names() {
  std::vector<std::string> names;
  Optimizers::for_each([&]<class Opt>() { names.push_back(Opt::kName); });
  return c10::Join(", ", names);
}

template <class Device>
struct Entry {
  static void unscale_(at::TensorList tensors, at::Tensor& found_inf, const at::Tensor& inv_scale) {
    BelowAutograd below;
    core::Staging staging;
    const auto walked = core::validate_unscale("unscale_", tensors, found_inf, &inv_scale, true, &staging);
    Device::unscale(walked, found_inf, &inv_scale);
    staging.copy_back();
  }

  static void non_finite_check_(at::TensorList tensors, at::Tensor& found_inf) {
    BelowAutograd below;
    core::Staging staging;
    const auto walked = core::validate_unscale("non_finite_check_", tensors, found_inf, nullptr, false, &staging);
    Device::unscale(walked, found_inf, nullptr);
  }

  static void grad_norm_(at::TensorList tensors, at::Tensor& found_inf, at::Tensor& norm,
                         const std::optional<at::Tensor>& inv_scale, double norm_type) {
    BelowAutograd below;
    core::Staging staging;
    const char* op = "grad_norm_";
    const at::Tensor* inv = inv_scale && inv_scale->defined() ? &*inv_scale : nullptr;
    const auto walked = core::validate_unscale(op, tensors, found_inf, inv, false, &staging);
    const ops::NormKind kind = core::validate_grad_norm(op, norm, found_inf, norm_type);
    Device::grad_norm(walked, found_inf, norm, inv, kind);
  }

  static void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker,
                            const at::Tensor& found_inf, double growth_factor,
                            double backoff_factor, int64_t growth_interval, int64_t hysteresis,
                            const std::optional<at::Tensor>& hysteresis_tracker,
                            std::optional<double> min_scale, std::optional<double> max_scale) {
    BelowAutograd below;
    const ops::ScaleUpdateArgs args = core::update_scale_args(
        scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval,
        hysteresis, hysteresis_tracker, min_scale, max_scale);
    Device::update_scale({scale, growth_tracker, found_inf,
                          hysteresis_tracker && hysteresis_tracker->defined() ? &*hysteresis_tracker
                                                                              : nullptr},
                         args);
    // torch._amp_update_scale_ returns the scale it updated in place, so its version moves
    if (!scale.is_inference()) scale.unsafeGetTensorImpl()->bump_version();
  }

  static void delayed_scale_update_(at::TensorList amax_histories, at::TensorList scales, at::TensorList scale_invs,
                                    double fp8_max, double margin, c10::string_view amax_compute_algo,
                                    const std::optional<at::Tensor>& amax_reduction_buffer) {
    BelowAutograd below;
    const core::DelayedScalingTensors t{amax_histories, scales, scale_invs,
                                        amax_reduction_buffer ? &*amax_reduction_buffer : nullptr};
    const ops::DelayedScalingArgs args = core::delayed_scaling_args(t, fp8_max, margin, amax_compute_algo);
    if (amax_histories.empty()) return;
    Device::delayed_scale_update(t, args);
    bump_versions(amax_histories);
    bump_versions(scales);
    bump_versions(scale_invs);
  }

  // One step of the optimizer named `optimizer` (optimizers.h): its states one list after
  // another; `hyper` its hyperparameters in its descriptor's order (ops/optimizer.h), then lr and
  // max_grad_norm; the other parts as register.cpp's schema says.
  static void step_(c10::string_view optimizer, at::TensorList params, at::TensorList grads,
                    at::TensorList master_params, at::TensorList states, at::TensorList steps,
                    at::TensorList state_absmaxes, at::TensorList scalar_states, at::TensorList outputs,
                    at::TensorList epilogues, c10::ArrayRef<int64_t> epilogue_layout, c10::ArrayRef<double> hyper,
                    const c10::List<std::optional<at::Tensor>>& scalars, c10::ArrayRef<int64_t> rounding,
                    bool unscale_grads) {
    BelowAutograd below;
    core::Staging staging;
    core::Staging* stage = Device::kRunsKernels ? &staging : nullptr;  // (the check op stages nothing)
    const std::string name(optimizer);
    const std::string op = "step_(" + name + ")";
    const core::StepScalars scalar = core::step_scalars(op.c_str(), scalars, rounding);
    const core::Epilogues epilogue = core::epilogues_of(op.c_str(), epilogues, epilogue_layout);
    std::optional<core::StepArgs> a;
    const bool known = Optimizers::find(name.c_str(), [&]<class Opt>() {
      if (hyper.size() != static_cast<size_t>(ops::kHyperCount<Opt>) + 2) {  // (names for the message only)
        std::vector<std::string> names;
        for (const auto& field : Opt::kHyperFields) names.push_back(field.name);
        names.insert(names.end(), {"lr", "max_grad_norm"});
        TORCH_CHECK_VALUE(false, op, ": hyper has ", hyper.size(), " values, expected ", names.size(), " (",
                          c10::Join(", ", names), ")");
      }
      const typename Opt::Hyper h = ops::hyper_of<Opt>(hyper.data());
      const size_t own = hyper.size() - 2;
      const core::StepInputs in{.params = params,
                                .grads = grads,
                                .master_params = master_params,
                                .states = {states, Opt::kStateInfo, Opt::kStates, Opt::state_mask(h)},
                                .state_absmaxes = state_absmaxes,
                                .steps = steps,
                                .steps_required = Opt::steps_required(h),
                                .scalars = scalar_states,
                                .scalar_key = Opt::kScalarKey,
                                .outputs = outputs,
                                .writes_output = Opt::kWritesOutput,
                                .lr = hyper[own],
                                .lr_tensor = scalar.lr_tensor,
                                .inv_scale = scalar.inv_scale,
                                .found_inf = scalar.found_inf,
                                .grad_norm = scalar.grad_norm,
                                .max_grad_norm = hyper[own + 1],
                                .rounding_seed = scalar.rounding_seed,
                                .stochastic_codes = scalar.stochastic_codes,
                                .unscale_grads = unscale_grads};
      a = core::StepArgs{Optimizers::index<Opt>(), core::validate_step(op.c_str(), in, stage),
                         std::vector<double>(hyper.begin(), hyper.begin() + own)};
      if (epilogue.weight_amax) {
        core::check_weight_amax(op.c_str(), *epilogue.weight_amax, params, Opt::kWritesOutput);
        a->tensors.weight_amax = *epilogue.weight_amax;
      }
      core::check_float8_weights(op.c_str(), epilogue.float8, Opt::kWritesOutput, a->tensors, stage);
    });
    TORCH_CHECK_VALUE(known, "step_: unknown optimizer '", name, "'; known: ", optimizer_names());
    if (!Device::kRunsKernels || params.empty()) return;
    Device::step(*a);
    staging.copy_back();
    bump_step_versions(a->tensors, params, grads, master_params, states, state_absmaxes, steps, outputs);
    bump_versions(scalar_states);
    bump_versions(epilogue.float8.weights);
    bump_versions(epilogue.float8.scale_invs);
    for (const at::Tensor& t : epilogue.float8.scales) {  // (a delayed scale is read, MX scales are written)
      if (core::is_mx_scale(t)) bump_versions(t);
    }
    if (epilogue.weight_amax) bump_versions(*epilogue.weight_amax);
  }
};

// Registers the Entry of `Device` for the dispatch key of `m` (a TORCH_LIBRARY_IMPL block).
template <class Device>
void register_entries(torch::Library& m) {
  m.impl("unscale_", &Entry<Device>::unscale_);
  m.impl("non_finite_check_", &Entry<Device>::non_finite_check_);
  m.impl("grad_norm_", &Entry<Device>::grad_norm_);
  m.impl("update_scale_", &Entry<Device>::update_scale_);
  m.impl("step_", &Entry<Device>::step_);
  m.impl("delayed_scale_update_", &Entry<Device>::delayed_scale_update_);
}

// What a device implements (cpu/cpu_ops.cpp, cuda/cuda_ops.cpp), declared once for both.
#define FUSED_AMP_DEVICE_OPS(body)                                                                             \
  static void unscale(at::TensorList tensors, const at::Tensor& found_inf, const at::Tensor* inv_scale) body; \
  static void grad_norm(at::TensorList tensors, const at::Tensor& found_inf, const at::Tensor& norm,          \
                        const at::Tensor* inv_scale, ops::NormKind kind) body;                                \
  static void update_scale(const core::ScaleTensors& t, const ops::ScaleUpdateArgs& args) body;              \
  static void delayed_scale_update(const core::DelayedScalingTensors& t, const ops::DelayedScalingArgs& args) \
      body;                                                                                                  \
  static void step(const core::StepArgs& a) body;

namespace cpu {
struct Device {
  static constexpr bool kRunsKernels = true;
  FUSED_AMP_DEVICE_OPS()
};
}  // namespace cpu

// The fused_amp_check:: ops (register.cpp), which torch.compile's fake kernels run on meta
// tensors (fused_amp/_fake.py): the same validation as the real devices, and no work.
namespace meta {
struct Device {
  static constexpr bool kRunsKernels = false;
  FUSED_AMP_DEVICE_OPS({})
};
}  // namespace meta

namespace cuda {
struct Device {
  static constexpr bool kRunsKernels = true;
  FUSED_AMP_DEVICE_OPS()
};
}  // namespace cuda

}  // namespace fused_amp
