#pragma once
#include "ops/optimizer.h"

namespace fused_amp::ops {

struct SgdCoeffs {
  float lr;
  float momentum;
  float one_minus_dampening;
  float weight_decay;
  float inv_scale;  // 1/loss scale, times the clip coefficient: the grad used is grad * inv_scale
  float grad_mult;  // inv_scale, negated for maximize
  bool nesterov;
  bool first_step;  // the momentum buffer starts as the first gradient, as in torch
};

struct SgdHyper {
  double momentum, dampening, weight_decay;
  bool nesterov, maximize;
};

FA_HD SgdCoeffs sgd_coeffs(const SgdHyper& h, double lr, bool first_step, float inv_scale) {
  SgdCoeffs c;
  c.lr = static_cast<float>(lr);
  c.momentum = static_cast<float>(h.momentum);
  c.one_minus_dampening = static_cast<float>(1.0 - h.dampening);
  c.weight_decay = static_cast<float>(h.weight_decay);
  c.inv_scale = inv_scale;
  c.grad_mult = h.maximize ? -inv_scale : inv_scale;
  c.nesterov = h.nesterov;
  c.first_step = first_step;
  return c;
}

// One element of SGD on fp32 values (T = float or a vector of floats), with the operations and
// fused multiply-adds of torch's fused CPU SGD (see adam_update on contraction):
//   g = grad * grad_mult + wd * p;  buf = g (first step) or momentum buf + (1 - dampening) g
//   p -= lr * (nesterov ? g + momentum buf : buf)          (momentum == 0: p -= lr g)
template <typename T>
FA_HD void sgd_update(T& param, T grad, T& momentum_buffer, const SgdCoeffs& c) {
  grad = grad * T(c.grad_mult);
  if (c.weight_decay != 0.f) grad = fma_(param, T(c.weight_decay), grad);
  if (c.momentum != 0.f) {
    if (c.first_step) {
      momentum_buffer = grad;
    } else {
      momentum_buffer = fma_(T(c.one_minus_dampening), grad, momentum_buffer * T(c.momentum));
    }
    grad = c.nesterov ? fma_(momentum_buffer, T(c.momentum), grad) : momentum_buffer;
  }
  param = fma_(grad, T(-c.lr), param);
}

// The descriptor (ops/optimizer.h). The momentum buffer is kept with momentum only; the step
// counts then (its first step starts the buffer), and optionally without (for the random bits of
// stochastic rounding, which change with the step).
struct Sgd : Elementwise {
  static constexpr const char* kName = "sgd";
  static constexpr int kStates = 1;
  static constexpr StateInfo kStateInfo[kStates] = {{"momentum_buffers", "momentum_buffer", true, false}};
  using Hyper = SgdHyper;
  static constexpr HyperField<Hyper> kHyperFields[] = {FA_HYPER(momentum), FA_HYPER(dampening),
                                                      FA_HYPER(weight_decay), FA_HYPER(nesterov), FA_HYPER(maximize)};
  using Coeffs = SgdCoeffs;
  FA_HD unsigned state_mask(const Hyper& h) { return h.momentum != 0.0 ? 1u : 0u; }
  FA_HD bool steps_required(const Hyper& h) { return h.momentum != 0.0; }
  FA_HD Coeffs coeffs(const Hyper& h, double lr, const TensorStep& s, float grad_mult) {
    return sgd_coeffs(h, lr, h.momentum != 0.0 && s.step == 0.f, grad_mult);
  }
  FA_HD bool has_state(const Coeffs& c, int) { return c.momentum != 0.f; }
  FA_HD bool reads_states(const Coeffs& c) { return !c.first_step; }
  template <typename T>
  FA_HD void update(T& p, T g, T (&s)[kStates], const Coeffs& c) { sgd_update(p, g, s[0], c); }
};

}  // namespace fused_amp::ops
