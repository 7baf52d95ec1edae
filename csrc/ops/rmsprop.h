#pragma once
#include "ops/lerp.h"
#include "ops/optimizer.h"

namespace fused_amp::ops {

// RMSprop (Hinton's lecture 6e; centered: Graves 2013) as torch.optim.RMSprop computes it, each
// operation rounding once in fp32 (fma_ where torch's CPU kernels fuse, as in ops/adagrad.h):
//   g = grad * grad_mult;  g += wd p;  v = alpha v + ((1 - alpha) g) g
//   centered: a = lerp(a, g, 1 - alpha), d = sqrt(v - a a) + eps;  else d = sqrt(v) + eps
//   momentum: b = momentum b + g / d, p -= lr b;  else p -= (lr g) / d
struct RmspropCoeffs {
  float lr;
  float alpha;
  float one_minus_alpha;
  float eps;
  float weight_decay;
  float momentum;
  float inv_scale;  // 1/loss scale, times the clip coefficient: the grad used is grad * inv_scale
  float grad_mult;  // inv_scale, negated for maximize
  bool centered;
};

struct RmspropHyper {
  double alpha, eps, weight_decay, momentum;
  bool centered, maximize;
};

template <typename T>
FA_HD void rmsprop_update(T& param, T grad, T& square_avg, T& momentum_buffer, T& grad_avg,
                          const RmspropCoeffs& c) {
  grad = grad * T(c.grad_mult);
  if (c.weight_decay != 0.f) grad = fma_(param, T(c.weight_decay), grad);
  square_avg = fma_(T(c.one_minus_alpha) * grad, grad, square_avg * T(c.alpha));
  T denom;
  if (c.centered) {
    grad_avg = torch_lerp_(grad_avg, grad, c.one_minus_alpha);
    denom = sqrt_(fma_(T(0.f) - grad_avg, grad_avg, square_avg)) + T(c.eps);
  } else {
    denom = sqrt_(square_avg) + T(c.eps);
  }
  if (c.momentum != 0.f) {
    momentum_buffer = momentum_buffer * T(c.momentum) + grad / denom;
    param = fma_(momentum_buffer, T(-c.lr), param);
  } else {
    param = param - T(c.lr) * grad / denom;
  }
}

// The descriptor (ops/optimizer.h): the momentum buffer with momentum only, the grad average when
// centered only.
struct Rmsprop : Elementwise {
  static constexpr const char* kName = "rmsprop";
  static constexpr int kStates = 3;
  static constexpr StateInfo kStateInfo[kStates] = {{"square_avgs", "square_avg", false, true},
                                                    {"momentum_buffers", "momentum_buffer", true, false},
                                                    {"grad_avgs", "grad_avg", true, false}};
  using Hyper = RmspropHyper;
  static constexpr HyperField<Hyper> kHyperFields[] = {FA_HYPER(alpha), FA_HYPER(eps), FA_HYPER(weight_decay),
                                                      FA_HYPER(momentum), FA_HYPER(centered), FA_HYPER(maximize)};
  using Coeffs = RmspropCoeffs;
  FA_HD unsigned state_mask(const Hyper& h) { return 1u | (h.momentum != 0.0 ? 2u : 0u) | (h.centered ? 4u : 0u); }
  FA_HD bool steps_required(const Hyper&) { return true; }
  FA_HD Coeffs coeffs(const Hyper& h, double lr, const TensorStep&, float grad_mult) {
    return {static_cast<float>(lr), static_cast<float>(h.alpha), static_cast<float>(1.0 - h.alpha),
            static_cast<float>(h.eps), static_cast<float>(h.weight_decay), static_cast<float>(h.momentum),
            grad_mult, h.maximize ? -grad_mult : grad_mult, h.centered};
  }
  FA_HD bool has_state(const Coeffs& c, int k) { return k == 0 || (k == 1 ? c.momentum != 0.f : c.centered); }
  template <typename T>
  FA_HD void update(T& p, T g, T (&s)[kStates], const Coeffs& c) { rmsprop_update(p, g, s[0], s[1], s[2], c); }
};

}  // namespace fused_amp::ops
