#pragma once
#include "ops/lerp.h"
#include "ops/optimizer.h"

namespace fused_amp::ops {

// NAdam (Dozat 2016, "Incorporating Nesterov Momentum into Adam") as torch.optim.NAdam computes
// it, each operation rounding once in fp32, the step's scalars in double as torch forms them
// from Python floats, and the running product of the momentum schedule in fp32 as torch keeps it
// (state["mu_product"], a per-param scalar: its value times float(mu_t), rounded):
//   g = grad * grad_mult;  g += wd p (or p *= 1 - lr wd, decoupled);  m = lerp(m, g, 1 - beta1)
//   v = beta2 v + ((1 - beta2) g) g;  d = sqrt(v / (1 - beta2^t)) + eps
//   p += (c1 g) / d;  p += (c2 m) / d,  c1 = -lr (1 - mu_t) / (1 - P_t),  c2 = -lr mu_{t+1} / (1 - P_t mu_{t+1})
// with mu_t = beta1 (1 - 0.5 * 0.96^(t momentum_decay)) and P_t = P_{t-1} mu_t.
struct NadamCoeffs {
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float eps;
  float weight_decay;
  float weight_decay_factor;  // 1 - lr * weight_decay (decoupled)
  float bias_correction2;     // 1 - beta2^t
  float grad_coeff;           // c1
  float exp_avg_coeff;        // c2
  float inv_scale;            // 1/loss scale, times the clip coefficient: the grad used is grad * inv_scale
  float grad_mult;            // inv_scale, negated for maximize
  bool decoupled_weight_decay;
};

struct NadamHyper {
  double beta1, beta2, eps, weight_decay, momentum_decay;
  bool decoupled_weight_decay, maximize;
};

template <typename T>
FA_HD void nadam_update(T& param, T grad, T& exp_avg, T& exp_avg_sq, const NadamCoeffs& c) {
  grad = grad * T(c.grad_mult);
  if (c.weight_decay != 0.f) {
    if (c.decoupled_weight_decay) {
      param = param * T(c.weight_decay_factor);
    } else {
      grad = fma_(param, T(c.weight_decay), grad);
    }
  }
  exp_avg = torch_lerp_(exp_avg, grad, c.one_minus_beta1);
  exp_avg_sq = fma_(T(c.one_minus_beta2) * grad, grad, exp_avg_sq * T(c.beta2));
  const T denom = sqrt_(exp_avg_sq / T(c.bias_correction2)) + T(c.eps);
  param = param + T(c.grad_coeff) * grad / denom;
  param = param + T(c.exp_avg_coeff) * exp_avg / denom;
}

// The descriptor (ops/optimizer.h); its per-param scalar is mu_product.
struct Nadam : Elementwise {
  static constexpr const char* kName = "nadam";
  static constexpr int kStates = 2;
  static constexpr StateInfo kStateInfo[kStates] = {{"exp_avgs", "exp_avg", true, false},
                                                    {"exp_avg_sqs", "exp_avg_sq", false, true}};
  static constexpr const char* kScalarKey = "mu_product";
  using Hyper = NadamHyper;
  static constexpr HyperField<Hyper> kHyperFields[] = {FA_HYPER(beta1), FA_HYPER(beta2), FA_HYPER(eps),
                                                      FA_HYPER(weight_decay), FA_HYPER(momentum_decay),
                                                      FA_HYPER(decoupled_weight_decay), FA_HYPER(maximize)};
  using Coeffs = NadamCoeffs;
  FA_HD unsigned state_mask(const Hyper&) { return 3u; }
  FA_HD bool steps_required(const Hyper&) { return true; }
  FA_HD double mu(const Hyper& h, double t) { return h.beta1 * (1.0 - 0.5 * pow(0.96, t * h.momentum_decay)); }
  // the scalar after this step: torch's mu_product *= mu, an fp32 product
  FA_HD float advance(const Hyper& h, const TensorStep& s) {
    return s.scalar * static_cast<float>(mu(h, s.step + 1.f));
  }
  FA_HD Coeffs coeffs(const Hyper& h, double lr, const TensorStep& s, float grad_mult) {
    const double t = s.step + 1.f;
    const double mu_t = mu(h, t), mu_next = mu(h, t + 1.0);
    const double product = advance(h, s);
    const double product_next = product * mu_next;
    return {static_cast<float>(1.0 - h.beta1), static_cast<float>(h.beta2), static_cast<float>(1.0 - h.beta2),
            static_cast<float>(h.eps), static_cast<float>(h.weight_decay),
            static_cast<float>(1.0 - lr * h.weight_decay), static_cast<float>(1.0 - pow(h.beta2, t)),
            static_cast<float>(-lr * (1.0 - mu_t) / (1.0 - product)),
            static_cast<float>(-lr * mu_next / (1.0 - product_next)), grad_mult, h.maximize ? -grad_mult : grad_mult,
            h.decoupled_weight_decay};
  }
  template <typename T>
  FA_HD void update(T& p, T g, T (&s)[kStates], const Coeffs& c) { nadam_update(p, g, s[0], s[1], c); }
};

}  // namespace fused_amp::ops
