#pragma once
#include "ops/optimizer.h"

namespace fused_amp::ops {

// AdEMAMix (Pagliardini, Ablin & Grangier 2024, "The AdEMAMix Optimizer: Better, Faster,
// Older", Algorithm 1), with bitsandbytes' alpha and beta3 warm-ups; each operation rounds once
// in fp32, the step's scalars formed in double:
//   g = grad * grad_mult;  m1 = beta1 m1 + (1 - beta1) g;  m2 = beta3_t m2 + (1 - beta3_t) g
//   nu = beta2 nu + ((1 - beta2) g) g;  u = (m1 / (1 - beta1^t) + alpha_t m2) / (sqrt(nu) / sqrt(1 - beta2^t) + eps)
//   p -= lr (u + wd p)
// alpha_t = min(t alpha / T_alpha, alpha) and beta3_t = min(exp(ln beta1 ln beta3 /
// ((1 - t / T_beta3) ln beta3 + (t / T_beta3) ln beta1)), beta3) during their warm-ups (T = 0: none).
struct AdemamixCoeffs {
  float lr;
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float beta3;  // beta3_t
  float one_minus_beta3;
  float alpha;  // alpha_t
  float eps;
  float weight_decay;
  float bias_correction1;              // 1 - beta1^t
  KnownDivisor bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float inv_scale;              // 1/loss scale, times the clip coefficient: the grad used is grad * inv_scale
  float grad_mult;              // inv_scale, negated for maximize
};

struct AdemamixHyper {
  double beta1, beta2, beta3, alpha, t_alpha, t_beta3, eps, weight_decay;
  bool maximize;
};

template <typename T>
FA_HD void ademamix_update(T& param, T grad, T& m1, T& m2, T& nu, const AdemamixCoeffs& c) {
  grad = grad * T(c.grad_mult);
  m1 = fma_(grad, T(c.one_minus_beta1), m1 * T(c.beta1));
  m2 = fma_(grad, T(c.one_minus_beta3), m2 * T(c.beta3));
  nu = fma_(T(c.one_minus_beta2) * grad, grad, nu * T(c.beta2));
  const T denom = div_by_(sqrt_(nu), c.bias_correction2_sqrt) + T(c.eps);
  T update = (m1 / T(c.bias_correction1) + T(c.alpha) * m2) / denom;
  update = fma_(param, T(c.weight_decay), update);
  param = param - T(c.lr) * update;
}

// The descriptor (ops/optimizer.h).
struct Ademamix : Elementwise {
  static constexpr const char* kName = "ademamix";
  static constexpr int kStates = 3;
  // the two EMAs take the low random bits (independent values), the second moment the high ones
  static constexpr StateInfo kStateInfo[kStates] = {
      {"exp_avgs_fast", "m1", true, false}, {"exp_avgs_slow", "m2", true, false}, {"exp_avg_sqs", "nu", false, true}};
  using Hyper = AdemamixHyper;
  static constexpr HyperField<Hyper> kHyperFields[] = {FA_HYPER(beta1), FA_HYPER(beta2), FA_HYPER(beta3),
                                                      FA_HYPER(alpha), FA_HYPER(t_alpha), FA_HYPER(t_beta3),
                                                      FA_HYPER(eps), FA_HYPER(weight_decay), FA_HYPER(maximize)};
  using Coeffs = AdemamixCoeffs;
  FA_HD unsigned state_mask(const Hyper&) { return 7u; }
  FA_HD bool steps_required(const Hyper&) { return true; }
  FA_HD Coeffs coeffs(const Hyper& h, double lr, const TensorStep& s, float grad_mult) {
    const double t = s.step + 1.f;
    const double alpha = h.t_alpha > 0.0 ? fmin(t * h.alpha / h.t_alpha, h.alpha) : h.alpha;
    double beta3 = h.beta3;
    if (h.t_beta3 > 0.0) {
      const double ln1 = log(h.beta1), ln3 = log(h.beta3), s = t / h.t_beta3;
      beta3 = fmin(exp(ln1 * ln3 / ((1.0 - s) * ln3 + s * ln1)), h.beta3);
    }
    return {static_cast<float>(lr), static_cast<float>(h.beta1), static_cast<float>(1.0 - h.beta1),
            static_cast<float>(h.beta2), static_cast<float>(1.0 - h.beta2), static_cast<float>(beta3),
            static_cast<float>(1.0 - beta3), static_cast<float>(alpha), static_cast<float>(h.eps),
            static_cast<float>(h.weight_decay), static_cast<float>(1.0 - pow(h.beta1, t)),
            known_divisor(static_cast<float>(sqrt(1.0 - pow(h.beta2, t)))), grad_mult,
            h.maximize ? -grad_mult : grad_mult};
  }
  template <typename T>
  FA_HD void update(T& p, T g, T (&s)[kStates], const Coeffs& c) { ademamix_update(p, g, s[0], s[1], s[2], c); }
};

}  // namespace fused_amp::ops
