#pragma once
#include "ops/lerp.h"
#include "ops/optimizer.h"

namespace fused_amp::ops {

// Muon's momentum pass (torch.optim.Muon's per-param loop before Newton-Schulz):
//   g = grad * inv_scale;  B = lerp(B, g, 1 - momentum);  update = lerp(g, B, momentum) (nesterov) or B
// The update is written as bf16, Newton-Schulz's input (an output list of the step op: the
// descriptor writes no param); the step itself is applied elsewhere (fused_amp/optim/muon.py).
struct MuonCoeffs {
  float momentum;
  float one_minus_momentum;  // (float)(1 - momentum), the weight torch's lerp_ receives
  float inv_scale;           // 1/loss scale, times the clip coefficient
  bool nesterov;
};

struct MuonHyper {
  double momentum;
  bool nesterov;
};

FA_HD MuonCoeffs muon_coeffs(const MuonHyper& h, float inv_scale) {
  MuonCoeffs c;
  c.momentum = static_cast<float>(h.momentum);
  c.one_minus_momentum = static_cast<float>(1.0 - h.momentum);
  c.inv_scale = inv_scale;
  c.nesterov = h.nesterov;
  return c;
}

// One element: updates the momentum `buf` and returns the Newton-Schulz input (before bf16).
template <typename T>
FA_HD T muon_momentum(T grad, T& buf, const MuonCoeffs& c) {
  grad = grad * T(c.inv_scale);
  buf = torch_lerp_(buf, grad, c.one_minus_momentum);
  return c.nesterov ? torch_lerp_(grad, buf, c.momentum) : buf;
}

// The descriptor (ops/optimizer.h): the update's value is the Newton-Schulz input.
struct MuonMomentum : Elementwise {
  static constexpr const char* kName = "muon_momentum";
  static constexpr bool kWritesOutput = true;
  static constexpr int kStates = 1;
  // the momentum rounds to nearest (Muon refuses stochastic rounding of it)
  static constexpr StateInfo kStateInfo[kStates] = {{"momentum_buffers", "momentum_buffer", true, false}};
  using Hyper = MuonHyper;
  static constexpr HyperField<Hyper> kHyperFields[] = {FA_HYPER(momentum), FA_HYPER(nesterov)};
  using Coeffs = MuonCoeffs;
  FA_HD unsigned state_mask(const Hyper&) { return 1u; }
  FA_HD bool steps_required(const Hyper&) { return false; }
  FA_HD Coeffs coeffs(const Hyper& h, double, const TensorStep&, float grad_mult) {
    return muon_coeffs(h, grad_mult);
  }
  template <typename T>
  FA_HD void update(T& out, T g, T (&s)[kStates], const Coeffs& c) { out = muon_momentum(g, s[0], c); }
};

}  // namespace fused_amp::ops
