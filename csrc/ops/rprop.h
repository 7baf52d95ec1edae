#pragma once
#include "ops/optimizer.h"

namespace fused_amp::ops {

// Rprop (Riedmiller & Braun 1993; the variant without backtracking, as torch.optim.Rprop) in
// fp32, each operation rounding once:
//   g = grad * grad_mult;  s = sign(g prev)
//   step_size = clamp(step_size * (s > 0 ? eta+ : s < 0 ? eta- : 1), min, max)
//   g = 0 where s < 0;  p -= sign(g) step_size;  prev = g
// A NaN product keeps NaN through the factor, the clamp and the param, as torch's masks leave it.
// The learning rate only sets each step_size's first value (the optimizer's initial state).
struct RpropCoeffs {
  float eta_minus;
  float eta_plus;
  float step_size_min;
  float step_size_max;
  float inv_scale;  // 1/loss scale, times the clip coefficient: the grad used is grad * inv_scale
  float grad_mult;  // inv_scale, negated for maximize
};

struct RpropHyper {
  double eta_minus, eta_plus, step_size_min, step_size_max;
  bool maximize;
};

template <typename T>
FA_HD void rprop_update(T& param, T grad, T& prev, T& step_size, const RpropCoeffs& c) {
  grad = grad * T(c.grad_mult);
  const T s = sign_(grad * prev);
  // 1 where s is 0, NaN where s is NaN
  const T factor = where_positive_(s, T(c.eta_plus), where_positive_(T(0.f) - s, T(c.eta_minus), s * T(0.f) + T(1.f)));
  // clamp with NaN kept: max against min, then min against max as a max of negations (exact)
  const T low = nan_max_(step_size * factor, T(c.step_size_min));
  step_size = T(0.f) - nan_max_(T(0.f) - low, T(-c.step_size_max));
  grad = where_positive_(T(0.f) - s, T(0.f), grad);
  param = param - sign_(grad) * step_size;
  prev = grad;
}

// The descriptor (ops/optimizer.h).
struct Rprop : Elementwise {
  static constexpr const char* kName = "rprop";
  static constexpr int kStates = 2;
  static constexpr StateInfo kStateInfo[kStates] = {{"prevs", "prev", true, false},
                                                    {"step_sizes", "step_size", false, true}};
  using Hyper = RpropHyper;
  static constexpr HyperField<Hyper> kHyperFields[] = {FA_HYPER(eta_minus), FA_HYPER(eta_plus),
                                                      FA_HYPER(step_size_min), FA_HYPER(step_size_max),
                                                      FA_HYPER(maximize)};
  using Coeffs = RpropCoeffs;
  FA_HD unsigned state_mask(const Hyper&) { return 3u; }
  FA_HD bool steps_required(const Hyper&) { return true; }
  FA_HD Coeffs coeffs(const Hyper& h, double, const TensorStep&, float grad_mult) {
    return {static_cast<float>(h.eta_minus), static_cast<float>(h.eta_plus), static_cast<float>(h.step_size_min),
            static_cast<float>(h.step_size_max), grad_mult, h.maximize ? -grad_mult : grad_mult};
  }
  template <typename T>
  FA_HD void update(T& p, T g, T (&s)[kStates], const Coeffs& c) { rprop_update(p, g, s[0], s[1], c); }
};

}  // namespace fused_amp::ops
