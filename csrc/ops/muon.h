#pragma once
#include "ops/lerp.h"

namespace fused_amp::ops {

// Muon's momentum pass (torch.optim.Muon's per-param loop before Newton-Schulz):
//   g = grad * inv_scale;  B = lerp(B, g, 1 - momentum);  update = lerp(g, B, momentum) (nesterov) or B
// The update is written as bf16, Newton-Schulz's input; the step itself is applied elsewhere.
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

}  // namespace fused_amp::ops
