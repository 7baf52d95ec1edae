#pragma once
#include "ops/lerp.h"
#include "ops/optimizer.h"

namespace fused_amp::ops {

// Adamax (Kingma & Ba 2015, section 7.1) as torch.optim.Adamax computes it, each operation
// rounding once in fp32:
//   g = grad * grad_mult;  g += wd p;  m = lerp(m, g, 1 - beta1);  u = max(beta2 u, |g| + eps)
//   p -= (clr m) / u,  clr = lr / (1 - beta1^t) formed in double
// The max propagates NaN, as torch.maximum does.
struct AdamaxCoeffs {
  float clr;
  float one_minus_beta1;
  float beta2;
  float eps;
  float weight_decay;
  float inv_scale;  // 1/loss scale, times the clip coefficient: the grad used is grad * inv_scale
  float grad_mult;  // inv_scale, negated for maximize
};

struct AdamaxHyper {
  double beta1, beta2, eps, weight_decay;
  bool maximize;
};

template <typename T>
FA_HD void adamax_update(T& param, T grad, T& exp_avg, T& exp_inf, const AdamaxCoeffs& c) {
  grad = grad * T(c.grad_mult);
  if (c.weight_decay != 0.f) grad = fma_(param, T(c.weight_decay), grad);
  exp_avg = torch_lerp_(exp_avg, grad, c.one_minus_beta1);
  exp_inf = nan_max_(exp_inf * T(c.beta2), abs_(grad) + T(c.eps));
  param = param - T(c.clr) * exp_avg / exp_inf;
}

// The descriptor (ops/optimizer.h).
struct Adamax : Elementwise {
  static constexpr const char* kName = "adamax";
  static constexpr int kStates = 2;
  static constexpr StateInfo kStateInfo[kStates] = {{"exp_avgs", "exp_avg", true, false},
                                                    {"exp_infs", "exp_inf", false, true}};
  using Hyper = AdamaxHyper;
  static constexpr HyperField<Hyper> kHyperFields[] = {FA_HYPER(beta1), FA_HYPER(beta2), FA_HYPER(eps),
                                                      FA_HYPER(weight_decay), FA_HYPER(maximize)};
  using Coeffs = AdamaxCoeffs;
  FA_HD unsigned state_mask(const Hyper&) { return 3u; }
  FA_HD bool steps_required(const Hyper&) { return true; }
  FA_HD Coeffs coeffs(const Hyper& h, double lr, const TensorStep& s, float grad_mult) {
    const double t = s.step + 1.f;
    return {static_cast<float>(lr / (1.0 - pow(h.beta1, t))), static_cast<float>(1.0 - h.beta1),
            static_cast<float>(h.beta2), static_cast<float>(h.eps), static_cast<float>(h.weight_decay),
            grad_mult, h.maximize ? -grad_mult : grad_mult};
  }
  template <typename T>
  FA_HD void update(T& p, T g, T (&s)[kStates], const Coeffs& c) { adamax_update(p, g, s[0], s[1], c); }
};

}  // namespace fused_amp::ops
