#pragma once
#include "ops/optimizer.h"

namespace fused_amp::ops {

// Hyperparameters of one Adam/AdamW step, with the step-dependent terms of one tensor.
struct AdamCoeffs {
  float lr;
  float beta1;
  float beta2;
  float one_minus_beta1;
  float one_minus_beta2;
  float eps;
  float weight_decay;
  float weight_decay_factor;    // AdamW's 1 - lr * weight_decay
  float inv_scale;              // 1/loss scale, times the clip coefficient: the grad used is grad * inv_scale
  float grad_mult;              // inv_scale, negated for maximize
  float step_size;              // lr / (1 - beta1^step)
  KnownDivisor bias_correction2_sqrt;  // sqrt(1 - beta2^step), and its reciprocal
  bool decoupled_weight_decay;  // AdamW
  bool amsgrad;
  bool has_weight_decay;        // weight_decay != 0
  bool lerp_from_start;         // one_minus_beta1 < 0.5: lerp_'s first form
};

struct AdamHyper {
  double beta1, beta2, eps, weight_decay;
  bool decoupled_weight_decay, amsgrad, maximize;
};

// The coefficients of one tensor's update: bias corrections in double from the (already
// incremented) step count, as torch's fused Adam forms them, then rounded to fp32.
FA_HD AdamCoeffs adam_coeffs(const AdamHyper& h, double lr, double step, float inv_scale) {
  const double bias_correction1 = 1.0 - pow(h.beta1, step);
  const double bias_correction2 = 1.0 - pow(h.beta2, step);
  AdamCoeffs c;
  c.lr = static_cast<float>(lr);
  c.beta1 = static_cast<float>(h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.eps = static_cast<float>(h.eps);
  c.weight_decay_factor = static_cast<float>(1.0 - lr * h.weight_decay);
  c.weight_decay = static_cast<float>(h.weight_decay);
  c.inv_scale = inv_scale;
  c.grad_mult = h.maximize ? -inv_scale : inv_scale;
  c.step_size = static_cast<float>(lr / bias_correction1);
  c.bias_correction2_sqrt = known_divisor(static_cast<float>(sqrt(bias_correction2)));
  c.decoupled_weight_decay = h.decoupled_weight_decay;
  c.amsgrad = h.amsgrad;
  c.has_weight_decay = c.weight_decay != 0.f;
  c.lerp_from_start = c.one_minus_beta1 < 0.5f;
  return c;
}

// a + w (b - a), formed as torch's lerp forms it (exact at w = 0 and w = 1): from a when
// w < 0.5 (`from_start`), else from b.
template <typename T>
FA_HD T lerp_(T a, T b, float w, bool from_start) {
  return from_start ? fma_(T(w), b - a, a) : b - (b - a) * T(1.f - w);
}

// One element of Adam on fp32 values (T = float or a vector of floats), with the operations and
// the fused multiply-adds of torch's fused CPU Adam as its release build computes them (bitwise
// equal on fp32 params). The build compiles with contraction off, so each fma_ here is one and
// every other operation rounds: the CPU's vector and scalar paths and the GPU agree bit for bit.
//   g = grad * grad_mult;  g += wd * p (Adam)  or  p *= 1 - lr * wd (AdamW)
//   m = lerp(m, g, 1 - beta1);  v = beta2 v + (1 - beta2) g g;  vmax = max(vmax, v) (amsgrad)
//   p -= step_size * m / (sqrt(v or vmax) / sqrt(1 - beta2^t) + eps)
// C is AdamCoeffs, or a type derived from it that fixes its options at compile time.
template <typename T, typename C>
FA_HD void adam_update(T& param, T grad, T& exp_avg, T& exp_avg_sq, T& max_exp_avg_sq, const C& c) {
  grad = grad * T(c.grad_mult);
  if (c.has_weight_decay) {
    if (c.decoupled_weight_decay) {
      param = param * T(c.weight_decay_factor);
    } else {
      grad = fma_(param, T(c.weight_decay), grad);
    }
  }
  exp_avg = lerp_(exp_avg, grad, c.one_minus_beta1, c.lerp_from_start);
  exp_avg_sq = fma_(T(c.one_minus_beta2) * grad, grad, exp_avg_sq * T(c.beta2));
  T second_moment = exp_avg_sq;
  if (c.amsgrad) {
    max_exp_avg_sq = max_(max_exp_avg_sq, exp_avg_sq);
    second_moment = max_exp_avg_sq;
  }
  const T denom = div_by_(sqrt_(second_moment), c.bias_correction2_sqrt) + T(c.eps);
  param = param - T(c.step_size) * exp_avg / denom;
}

// The coefficients of the usual runs, with their options fixed at compile time (no amsgrad,
// beta1 >= 0.5, no weight decay or AdamW's): the CPU loop of these has no branch on an option.
template <bool kDecoupledWeightDecay>
struct UsualAdamCoeffs : AdamCoeffs {
  static constexpr bool has_weight_decay = kDecoupledWeightDecay;
  static constexpr bool decoupled_weight_decay = kDecoupledWeightDecay;
  static constexpr bool amsgrad = false;
  static constexpr bool lerp_from_start = true;
  explicit UsualAdamCoeffs(const AdamCoeffs& c) : AdamCoeffs(c) {}
};

// The descriptor (ops/optimizer.h): Adam, and AdamW as decoupled_weight_decay.
struct Adam : Elementwise {
  static constexpr const char* kName = "adam";
  static constexpr int kStates = 3;
  // exp_avg rounds with the low random bits, the second moments with the high ones
  // (max_exp_avg_sq with exp_avg_sq's: equal fp32 values stay equal)
  static constexpr StateInfo kStateInfo[kStates] = {
      {"exp_avgs", "exp_avg", true, false},
      {"exp_avg_sqs", "exp_avg_sq", false, true},
      {"max_exp_avg_sqs", "max_exp_avg_sq", false, true}};
  using Hyper = AdamHyper;
  static constexpr HyperField<Hyper> kHyperFields[] = {FA_HYPER(beta1), FA_HYPER(beta2), FA_HYPER(eps),
                                                      FA_HYPER(weight_decay), FA_HYPER(decoupled_weight_decay),
                                                      FA_HYPER(amsgrad), FA_HYPER(maximize)};
  using Coeffs = AdamCoeffs;
  FA_HD unsigned state_mask(const Hyper& h) { return h.amsgrad ? 7u : 3u; }
  FA_HD bool steps_required(const Hyper&) { return true; }
  FA_HD Coeffs coeffs(const Hyper& h, double lr, const TensorStep& s, float grad_mult) {
    return adam_coeffs(h, lr, s.step + 1.f, grad_mult);
  }
  template <class C>
  FA_HD bool has_state(const C& c, int k) { return k < 2 || c.amsgrad; }
  template <typename T, class C>
  FA_HD void update(T& p, T g, T (&s)[kStates], const C& c) { adam_update(p, g, s[0], s[1], s[2], c); }
  template <class F>
  static void with_fixed_options(const Coeffs& c, F&& f) {
    if (!c.amsgrad && c.lerp_from_start) {
      if (!c.has_weight_decay) return f(UsualAdamCoeffs<false>(c));
      if (c.decoupled_weight_decay) return f(UsualAdamCoeffs<true>(c));
    }
    f(c);
  }
};

}  // namespace fused_amp::ops
