#pragma once
#include "ops/optimizer.h"

namespace fused_amp::ops {

// Adagrad (Duchi et al. 2011) as torch.optim.Adagrad computes it, each operation rounding once
// in fp32 (the build contracts nothing; each fma_ is one, where torch's CPU kernels fuse: add
// with alpha, addcmul; addcdiv is self + (value t1) / t2):
//   g = grad * grad_mult;  g += wd p;  sum += g g;  p -= (clr g) / (sqrt(sum) + eps)
// with clr = lr / (1 + (t - 1) lr_decay) formed in double, as torch forms it from Python floats.
struct AdagradCoeffs {
  float clr;
  float eps;
  float weight_decay;
  float inv_scale;  // 1/loss scale, times the clip coefficient: the grad used is grad * inv_scale
  float grad_mult;  // inv_scale, negated for maximize
};

struct AdagradHyper {
  double lr_decay, weight_decay, eps;
  bool maximize;
};

template <typename T>
FA_HD void adagrad_update(T& param, T grad, T& sum, const AdagradCoeffs& c) {
  grad = grad * T(c.grad_mult);
  if (c.weight_decay != 0.f) grad = fma_(param, T(c.weight_decay), grad);
  sum = fma_(grad, grad, sum);
  param = param - T(c.clr) * grad / (sqrt_(sum) + T(c.eps));
}

// The descriptor (ops/optimizer.h). The sum only grows: kept in fp32 (fused_amp/optim/adagrad.py).
struct Adagrad : Elementwise {
  static constexpr const char* kName = "adagrad";
  static constexpr int kStates = 1;
  static constexpr StateInfo kStateInfo[kStates] = {{"state_sums", "sum", false, false}};
  using Hyper = AdagradHyper;
  static constexpr HyperField<Hyper> kHyperFields[] = {FA_HYPER(lr_decay), FA_HYPER(weight_decay), FA_HYPER(eps),
                                                      FA_HYPER(maximize)};
  using Coeffs = AdagradCoeffs;
  FA_HD unsigned state_mask(const Hyper&) { return 1u; }
  FA_HD bool steps_required(const Hyper&) { return true; }
  FA_HD Coeffs coeffs(const Hyper& h, double lr, const TensorStep& s, float grad_mult) {
    const double t = s.step + 1.f;
    return {static_cast<float>(lr / (1.0 + (t - 1.0) * h.lr_decay)), static_cast<float>(h.eps),
            static_cast<float>(h.weight_decay), grad_mult, h.maximize ? -grad_mult : grad_mult};
  }
  template <typename T>
  FA_HD void update(T& p, T g, T (&s)[kStates], const Coeffs& c) { adagrad_update(p, g, s[0], c); }
};

}  // namespace fused_amp::ops
