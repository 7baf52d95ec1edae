#pragma once
#include "ops/optimizer.h"

namespace fused_amp::ops {

// Adadelta (Zeiler 2012, "ADADELTA: An Adaptive Learning Rate Method", Algorithm 1) as
// torch.optim.Adadelta computes it, each operation rounding once in fp32 (fma_ where torch's CPU
// kernels fuse: add with alpha, addcmul):
//   g = grad * grad_mult;  g += wd p;  v = rho v + ((1 - rho) g) g
//   d = (sqrt(u + eps) / sqrt(v + eps)) g;  u = rho u + ((1 - rho) d) d;  p -= lr d
struct AdadeltaCoeffs {
  float lr;
  float rho;
  float one_minus_rho;
  float eps;
  float weight_decay;
  float inv_scale;  // 1/loss scale, times the clip coefficient: the grad used is grad * inv_scale
  float grad_mult;  // inv_scale, negated for maximize
};

struct AdadeltaHyper {
  double rho, eps, weight_decay;
  bool maximize;
};

template <typename T>
FA_HD void adadelta_update(T& param, T grad, T& square_avg, T& acc_delta, const AdadeltaCoeffs& c) {
  grad = grad * T(c.grad_mult);
  if (c.weight_decay != 0.f) grad = fma_(param, T(c.weight_decay), grad);
  square_avg = fma_(T(c.one_minus_rho) * grad, grad, square_avg * T(c.rho));
  const T delta = sqrt_(acc_delta + T(c.eps)) / sqrt_(square_avg + T(c.eps)) * grad;
  acc_delta = fma_(T(c.one_minus_rho) * delta, delta, acc_delta * T(c.rho));
  param = fma_(delta, T(-c.lr), param);
}

// The descriptor (ops/optimizer.h).
struct Adadelta : Elementwise {
  static constexpr const char* kName = "adadelta";
  static constexpr int kStates = 2;
  static constexpr StateInfo kStateInfo[kStates] = {{"square_avgs", "square_avg", false, false},
                                                    {"acc_deltas", "acc_delta", false, true}};
  using Hyper = AdadeltaHyper;
  static constexpr HyperField<Hyper> kHyperFields[] = {FA_HYPER(rho), FA_HYPER(eps), FA_HYPER(weight_decay),
                                                      FA_HYPER(maximize)};
  using Coeffs = AdadeltaCoeffs;
  FA_HD unsigned state_mask(const Hyper&) { return 3u; }
  FA_HD bool steps_required(const Hyper&) { return true; }
  FA_HD Coeffs coeffs(const Hyper& h, double lr, const TensorStep&, float grad_mult) {
    return {static_cast<float>(lr), static_cast<float>(h.rho), static_cast<float>(1.0 - h.rho),
            static_cast<float>(h.eps), static_cast<float>(h.weight_decay), grad_mult,
            h.maximize ? -grad_mult : grad_mult};
  }
  template <typename T>
  FA_HD void update(T& p, T g, T (&s)[kStates], const Coeffs& c) { adadelta_update(p, g, s[0], s[1], c); }
};

}  // namespace fused_amp::ops
