#pragma once
#include "ops/optimizer.h"

namespace fused_amp::ops {

// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2), with
// decoupled weight decay as in the paper.
struct LionCoeffs {
  float lr;
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float weight_decay_factor;  // 1 - lr * weight_decay
  float inv_scale;            // 1/loss scale, times the clip coefficient: the grad used is grad * inv_scale
  float grad_mult;            // inv_scale, negated for maximize
  bool has_weight_decay;
};

struct LionHyper {
  double beta1, beta2, weight_decay;
  bool maximize;
};

FA_HD LionCoeffs lion_coeffs(const LionHyper& h, double lr, float inv_scale) {
  LionCoeffs c;
  c.lr = static_cast<float>(lr);
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.weight_decay_factor = static_cast<float>(1.0 - lr * h.weight_decay);
  c.inv_scale = inv_scale;
  c.grad_mult = h.maximize ? -inv_scale : inv_scale;
  c.has_weight_decay = h.weight_decay != 0.0;
  return c;
}

// One element of Lion on fp32 values (T = float or a vector of floats); every operation rounds
// once (the build contracts nothing), as the same steps written with torch's tensor ops do:
//   g = grad * grad_mult;  c = beta1 m + (1 - beta1) g
//   p = p (1 - lr wd) - lr sign(c)        (sign(0) = 0 and sign(NaN) = NaN, as torch.sign)
//   m = beta2 m + (1 - beta2) g
// lr * sign(c) is exact, so the param's update rounds once, as p.add_(sign, alpha=-lr) does.
template <typename T>
FA_HD void lion_update(T& param, T grad, T& exp_avg, const LionCoeffs& c) {
  grad = grad * T(c.grad_mult);
  const T direction = sign_(exp_avg * T(c.beta1) + grad * T(c.one_minus_beta1));
  if (c.has_weight_decay) param = param * T(c.weight_decay_factor);
  param = param - T(c.lr) * direction;
  exp_avg = exp_avg * T(c.beta2) + grad * T(c.one_minus_beta2);
}

// The descriptor (ops/optimizer.h).
struct Lion : Elementwise {
  static constexpr const char* kName = "lion";
  static constexpr int kStates = 1;
  static constexpr StateInfo kStateInfo[kStates] = {{"exp_avgs", "exp_avg", true, false}};
  using Hyper = LionHyper;
  static constexpr HyperField<Hyper> kHyperFields[] = {FA_HYPER(beta1), FA_HYPER(beta2), FA_HYPER(weight_decay),
                                                      FA_HYPER(maximize)};
  using Coeffs = LionCoeffs;
  FA_HD unsigned state_mask(const Hyper&) { return 1u; }
  FA_HD bool steps_required(const Hyper&) { return true; }
  FA_HD Coeffs coeffs(const Hyper& h, double lr, const TensorStep&, float grad_mult) {
    return lion_coeffs(h, lr, grad_mult);
  }
  template <typename T>
  FA_HD void update(T& p, T g, T (&s)[kStates], const Coeffs& c) { lion_update(p, g, s[0], c); }
};

}  // namespace fused_amp::ops
