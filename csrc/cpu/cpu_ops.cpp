// CPU implementations: validate, lay all tensors end to end as one flat range, split that range
// evenly over torch's threads, and run the instruction-set-specific loops (cpu/loops.h).
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "core/flat_range.h"
#include "core/step_args.h"
#include "cpu/loops.h"
#include "ops/float8.h"
#include "ops/grad_norm.h"
#include "ops/quantize.h"
#include "ops/rounding.h"
#include "ops/update_scale.h"
#include "ops_impl.h"

namespace fused_amp::cpu {

namespace {

// Below this many elements a range is not worth a thread of its own.
constexpr int64_t kGrain = 1 << 15;

std::vector<int64_t> numels_of(at::TensorList tensors) {
  std::vector<int64_t> n;
  n.reserve(tensors.size());
  for (const auto& t : tensors) n.push_back(t.numel());
  return n;
}

int64_t round_up_to(int64_t i, int64_t block) { return (i + block - 1) / block * block; }

template <class F>
void parallel_over(const std::vector<int64_t>& offsets, F&& f) {
  at::parallel_for(0, offsets.back(), kGrain, [&](int64_t begin, int64_t end) {
    core::for_each_part(offsets, begin, end, f);
  });
}

// The unscale loop of x's dtype over x[b, e) (with write == false, the check only); true when
// some element is inf or NaN.
bool unscale_part(const at::Tensor& x, int64_t b, int64_t e, float inv_scale, bool write) {
  const Loops& k = loops();
  void* p = x.data_ptr();
  switch (x.scalar_type()) {
    case at::kFloat: return k.unscale_float(static_cast<float*>(p) + b, e - b, inv_scale, write);
    case at::kDouble: return k.unscale_double(static_cast<double*>(p) + b, e - b, inv_scale, write);
    case at::kHalf: return k.unscale_half(static_cast<c10::Half*>(p) + b, e - b, inv_scale, write);
    case at::kBFloat16:
      return k.unscale_bfloat16(static_cast<c10::BFloat16*>(p) + b, e - b, inv_scale, write);
    default: TORCH_INTERNAL_ASSERT(false, "dtype passed validation but has no loop");
  }
}

// Runs the unscale loop (or the check only) over every tensor; true when some element is not finite.
bool unscale_all(at::TensorList tensors, float inv_scale, bool write) {
  std::atomic<bool> nonfinite{false};
  parallel_over(core::flat_offsets(numels_of(tensors)), [&](size_t t, int64_t b, int64_t e) {
    if (unscale_part(tensors[t], b, e, inv_scale, write)) nonfinite.store(true, std::memory_order_relaxed);
  });
  return nonfinite.load();
}

// The grad norm's fixed split: ranges of kNormChunk elements, none across tensors, whose partial
// values are combined in order. It does not depend on the thread count, and neither do the bits.
constexpr int64_t kNormChunk = 1 << 16;

double norm_partial(const at::Tensor& x, int64_t b, int64_t e, float inv_scale, ops::NormKind kind) {
  const Loops& k = loops();
  const int kd = static_cast<int>(kind);
  const void* p = x.data_ptr();
  switch (x.scalar_type()) {
    case at::kFloat: return k.norm_float[kd](static_cast<const float*>(p) + b, e - b, inv_scale);
    case at::kDouble: return k.norm_double[kd](static_cast<const double*>(p) + b, e - b, inv_scale);
    case at::kHalf: return k.norm_half[kd](static_cast<const c10::Half*>(p) + b, e - b, inv_scale);
    case at::kBFloat16:
      return k.norm_bfloat16[kd](static_cast<const c10::BFloat16*>(p) + b, e - b, inv_scale);
    default: TORCH_INTERNAL_ASSERT(false, "dtype passed validation but has no loop");
  }
}

// found_inf != 0 means an earlier check saw inf/NaN: the step must change nothing.
bool skip_step(const core::StepTensors& s) {
  return s.found_inf && s.found_inf->item<float>() != 0.f;
}

double step_lr(const core::StepTensors& s) {
  return s.lr_tensor ? s.lr_tensor->item<double>() : s.lr;
}

// What the grads are multiplied by: the scaler's 1/scale, times the clip coefficient.
float step_grad_mult(const core::StepTensors& s) {
  const float inv = s.inv_scale ? s.inv_scale->item<float>() : 1.f;
  if (!s.grad_norm) return inv;
  return inv * ops::clip_coef(s.grad_norm->item<float>(), static_cast<float>(s.max_grad_norm));
}

// The elements [b, e) of param t and its partners, for the loops. `round_key` is the param's
// ops::rounding_key when its bf16 state and 24-bit master round stochastically.
template <typename T>
UpdateRange<T> range_of(const core::StepTensors& s, size_t t, int64_t b, int64_t e, bool write_grads,
                        uint32_t round_key, uint32_t* amax_bits) {
  // dtypes are validated: skip data_ptr<T>()'s check, a measurable cost with many small tensors
  // (b is even where elements take 4 bits: a block's first)
  auto at_b = [&](const std::vector<at::Tensor>& list, int64_t bits) -> void* {
    return list.empty() || !list[t].defined() ? nullptr
                                               : static_cast<char*>(list[t].data_ptr()) + b * bits / 8;
  };
  const int64_t state_bits = state_storage(s.state_kind(t)).bits;
  const MasterKind master = s.master_kind(t);
  const bool quantized = s.is_quantized(t);
  UpdateRange<T> r{static_cast<T*>(s.params[t].data_ptr()) + b,
                    static_cast<T*>(s.grads[t].data_ptr()) + b,
                    master,
                    at_b(s.masters, 8 * master_bytes(master)),
                    {},
                    quantized ? static_cast<float*>(s.absmaxes[t].data_ptr()) : nullptr,
                    quantized ? s.absmaxes[t].stride(0) : 0, e - b, b, round_key,
                    s.rounding_seed.has_value(), s.stochastic_codes, write_grads};
  for (int k = 0; k < ops::kMaxStates; ++k) r.state[k] = at_b(s.states[k], state_bits);
  if (!s.outputs.empty()) r.output = static_cast<c10::BFloat16*>(s.outputs[t].data_ptr()) + b;
  r.epilogues.amax_bits = amax_bits;
  if (!s.float8_weights.empty() && s.float8_weights[t].defined()) {
    r.epilogues.float8 = static_cast<uint8_t*>(s.float8_weights[t].data_ptr()) + b;
    if (s.is_mx(t)) {
      r.epilogues.mx_scales = static_cast<uint8_t*>(s.float8_scales[t].data_ptr()) + b / ops::kMxBlock;
    } else {
      r.epilogues.float8_scale = *s.float8_scales[t].data_ptr<float>();
    }
  }
  return r;
}

// Runs the loop of each param's dtype and state dtype over every param, with that param's
// coefficients (`coeffs[t]`, the loops' Coeffs) and rounding key (`round_keys[t]`). Grads
// multiplied by 1 keep their value: they are written back only when `grad_mult` changes them.
// With `amax_slots` (one per param, zero) the loops max into them the |param| they write (as bits).
template <class Coeffs>
void update_all(const core::StepTensors& s, float grad_mult, const std::vector<Coeffs>& coeffs,
                const std::vector<uint32_t>& round_keys, const Loops::Step& loops, uint32_t* amax_slots) {
  const auto& [on_float, on_half, on_bfloat16] = loops;
  const bool w = s.write_grads && grad_mult != 1.f;
  parallel_over(core::flat_offsets(numels_of(s.params)), [&](size_t t, int64_t b, int64_t e) {
    const int st = static_cast<int>(s.state_kind(t));
    // a block of codes or an MX block belongs to the range that holds its first element
    const int64_t block = s.is_quantized(t) ? state_storage(s.state_kind(t)).block : s.is_mx(t) ? ops::kMxBlock : 1;
    if (block > 1) {
      const int64_t n = s.params[t].numel();
      b = std::min(n, round_up_to(b, block));
      e = e == n ? n : std::min(n, round_up_to(e, block));
      if (b == e) return;
    }
    const uint32_t key = round_keys[t];
    uint32_t* const amax = amax_slots ? amax_slots + t : nullptr;
    switch (s.params[t].scalar_type()) {
      case at::kFloat: on_float[st](range_of<float>(s, t, b, e, w, key, amax), &coeffs[t]); break;
      case at::kHalf: on_half[st](range_of<c10::Half>(s, t, b, e, w, key, amax), &coeffs[t]); break;
      case at::kBFloat16: on_bfloat16[st](range_of<c10::BFloat16>(s, t, b, e, w, key, amax), &coeffs[t]); break;
      default: TORCH_INTERNAL_ASSERT(false, "dtype passed validation but has no loop");
    }
  });
}

// Each param's ops::rounding_key for the step it is about to take (none without a seed).
std::vector<uint32_t> round_keys_of(const core::StepTensors& s) {
  std::vector<uint32_t> keys(s.params.size(), 0u);
  if (!s.rounding_seed || s.steps.empty()) return keys;
  for (size_t t = 0; t < keys.size(); ++t) {
    keys[t] = ops::rounding_key(*s.rounding_seed, *s.steps[t].data_ptr<float>() + 1.f);
  }
  return keys;
}

void increment_steps(const core::StepTensors& s) {
  for (const auto& step : s.steps) *step.data_ptr<float>() += 1.f;
}

}  // namespace

void Device::unscale(at::TensorList tensors, const at::Tensor& found_inf, const at::Tensor* inv_scale) {
  const float inv = inv_scale ? inv_scale->item<float>() : 1.f;
  // x * 1 == x: with inv_scale 1 only the check is needed (torch skips the multiply too).
  if (unscale_all(tensors, inv, inv != 1.f)) *found_inf.data_ptr<float>() = 1.f;
}

void Device::grad_norm(at::TensorList tensors, const at::Tensor& found_inf, const at::Tensor& norm,
                       const at::Tensor* inv_scale, ops::NormKind kind) {
  const float inv = inv_scale ? inv_scale->item<float>() : 1.f;
  struct Range {
    size_t t;
    int64_t begin, end;
  };
  std::vector<Range> ranges;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const int64_t n = tensors[t].numel();
    for (int64_t b = 0; b < n; b += kNormChunk) ranges.push_back({t, b, std::min(n, b + kNormChunk)});
  }
  std::vector<double> partials(ranges.size());
  std::atomic<bool> nonfinite{false};
  at::parallel_for(0, static_cast<int64_t>(ranges.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const Range& g = ranges[r];
      partials[r] = norm_partial(tensors[g.t], g.begin, g.end, inv, kind);
      // A partial is not finite when an element is not, or (rarely) when finite values overflow:
      // the bits decide which.
      if (!std::isfinite(partials[r]) && unscale_part(tensors[g.t], g.begin, g.end, 1.f, false)) {
        nonfinite.store(true, std::memory_order_relaxed);
      }
    }
  });
  double total = 0.0;
  for (const double p : partials) total = ops::norm_combine(kind, total, p);
  *norm.data_ptr<float>() = ops::norm_finish(kind, total);
  if (nonfinite.load()) *found_inf.data_ptr<float>() = 1.f;
}

void Device::update_scale(const core::ScaleTensors& t, const ops::ScaleUpdateArgs& args) {
  int overflows = 0;  // without hysteresis the count is not kept
  int& overflows_in_row = t.hysteresis_tracker ? *t.hysteresis_tracker->data_ptr<int>() : overflows;
  ops::update_scale(*t.scale.data_ptr<float>(), *t.growth_tracker.data_ptr<int>(), overflows_in_row,
                    *t.found_inf.data_ptr<float>() != 0.f, args);
}

// One scale per column of each history (a few thousand at most): no threads.
void Device::delayed_scale_update(const core::DelayedScalingTensors& t, const ops::DelayedScalingArgs& args) {
  const float* reduced = t.reduced ? t.reduced->data_ptr<float>() : nullptr;
  for (size_t i = 0; i < t.histories.size(); ++i) {
    const int64_t length = t.histories[i].size(0), columns = t.histories[i].size(1);
    float* const history = t.histories[i].data_ptr<float>();
    float* const scale = t.scales[i].data_ptr<float>();
    float* const scale_inv = t.scale_invs[i].data_ptr<float>();
    for (int64_t c = 0; c < columns; ++c) {
      ops::delayed_scale_update(history + c, length, columns, reduced ? reduced + c : nullptr, scale[c], scale_inv[c],
                                args);
    }
    if (reduced) reduced += columns;
  }
}

void Device::step(const core::StepArgs& a) {
  const core::StepTensors& s = a.tensors;
  if (skip_step(s)) return;
  const double lr = step_lr(s);
  const float mult = step_grad_mult(s);
  Optimizers::at(a.optimizer, [&]<class Opt>() {
    const typename Opt::Hyper h = ops::hyper_of<Opt>(a.hyper.data());
    std::vector<ops::TensorStep> tensor_steps(s.params.size());
    for (size_t t = 0; t < s.params.size(); ++t) {
      tensor_steps[t] = {s.steps.empty() ? 0.f : *s.steps[t].data_ptr<float>(),
                         s.scalars.empty() ? 1.f : *s.scalars[t].data_ptr<float>()};
    }
    std::vector<typename Opt::Coeffs> coeffs;
    coeffs.reserve(s.params.size());
    for (size_t t = 0; t < s.params.size(); ++t) {
      const ops::TensorStep& ts = tensor_steps[t];
      // Params of a group almost always share their step: reuse the last coefficients.
      if (t > 0 && ts.step == tensor_steps[t - 1].step && ts.scalar == tensor_steps[t - 1].scalar) {
        coeffs.push_back(coeffs.back());
      } else {
        coeffs.push_back(Opt::coeffs(h, lr, ts, mult));
      }
    }
    std::vector<uint32_t> amax(s.weight_amax ? s.params.size() : 0, 0u);
    update_all(s, mult, coeffs, round_keys_of(s), loops().step[Optimizers::index<Opt>()],
               amax.empty() ? nullptr : amax.data());
    float* const out = s.weight_amax ? s.weight_amax->data_ptr<float>() : nullptr;
    for (size_t t = 0; t < amax.size(); ++t) out[t] = ops::float_of(amax[t]);  // (the |param| written)
    for (size_t t = 0; t < s.float8_scale_invs.size(); ++t) {
      if (s.float8_scale_invs[t].defined()) {
        *s.float8_scale_invs[t].data_ptr<float>() = 1.f / *s.float8_scales[t].data_ptr<float>();
      }
    }
    for (size_t t = 0; t < s.scalars.size(); ++t) *s.scalars[t].data_ptr<float>() = Opt::advance(h, tensor_steps[t]);
  });
  increment_steps(s);
}

}  // namespace fused_amp::cpu
