#pragma once
#include "ops/common.h"

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

}  // namespace fused_amp::ops
