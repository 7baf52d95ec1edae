#pragma once
#include "ops/lerp.h"
#include "ops/optimizer.h"

namespace fused_amp::ops {

// RAdam (Liu et al. 2020, "On the Variance of the Adaptive Learning Rate and Beyond") as
// torch.optim.RAdam computes it, each operation rounding once in fp32, the step's scalars formed
// in double as torch forms them from Python floats:
//   g = grad * grad_mult;  g += wd p (or p *= 1 - lr wd, decoupled);  m = lerp(m, g, 1 - beta1)
//   v = beta2 v + ((1 - beta2) g) g;  m^ = m / (1 - beta1^t)
//   rho_t > 5: p -= ((m^ lr) (sqrt(1 - beta2^t) / (sqrt(v) + eps))) r_t   else p -= m^ lr
// where rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t), rho_inf = 2 / (1 - beta2) - 1 and r_t the
// rectification sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t)).
struct RadamCoeffs {
  float lr;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float eps;
  float weight_decay;
  float weight_decay_factor;    // 1 - lr * weight_decay (decoupled)
  float bias_correction1;       // 1 - beta1^t
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float rect;                   // r_t
  float inv_scale;              // 1/loss scale, times the clip coefficient: the grad used is grad * inv_scale
  float grad_mult;              // inv_scale, negated for maximize
  bool decoupled_weight_decay;
  bool rectified;               // rho_t > 5
};

struct RadamHyper {
  double beta1, beta2, eps, weight_decay;
  bool decoupled_weight_decay, maximize;
};

template <typename T>
FA_HD void radam_update(T& param, T grad, T& exp_avg, T& exp_avg_sq, const RadamCoeffs& c) {
  grad = grad * T(c.grad_mult);
  if (c.weight_decay != 0.f) {
    if (c.decoupled_weight_decay) {
      param = param * T(c.weight_decay_factor);
    } else {
      grad = fma_(param, T(c.weight_decay), grad);
    }
  }
  exp_avg = torch_lerp_(exp_avg, grad, c.one_minus_beta1);
  exp_avg_sq = fma_(T(c.one_minus_beta2) * grad, grad, exp_avg_sq * T(c.beta2));
  const T step = exp_avg / T(c.bias_correction1) * T(c.lr);
  if (c.rectified) {
    // torch's float / tensor: the tensor's reciprocal times the float
    const T adaptive = T(1.f) / (sqrt_(exp_avg_sq) + T(c.eps)) * T(c.bias_correction2_sqrt);
    param = param - step * adaptive * T(c.rect);
  } else {
    param = param - step;
  }
}

// The descriptor (ops/optimizer.h).
struct Radam : Elementwise {
  static constexpr const char* kName = "radam";
  static constexpr int kStates = 2;
  static constexpr StateInfo kStateInfo[kStates] = {{"exp_avgs", "exp_avg", true, false},
                                                    {"exp_avg_sqs", "exp_avg_sq", false, true}};
  using Hyper = RadamHyper;
  static constexpr HyperField<Hyper> kHyperFields[] = {FA_HYPER(beta1), FA_HYPER(beta2), FA_HYPER(eps),
                                                      FA_HYPER(weight_decay), FA_HYPER(decoupled_weight_decay),
                                                      FA_HYPER(maximize)};
  using Coeffs = RadamCoeffs;
  FA_HD unsigned state_mask(const Hyper&) { return 3u; }
  FA_HD bool steps_required(const Hyper&) { return true; }
  FA_HD Coeffs coeffs(const Hyper& h, double lr, const TensorStep& s, float grad_mult) {
    const double t = s.step + 1.f;
    const double bias_correction2 = 1.0 - pow(h.beta2, t);
    const double rho_inf = 2.0 / (1.0 - h.beta2) - 1.0;
    const double rho_t = rho_inf - 2.0 * t * pow(h.beta2, t) / bias_correction2;
    const double rect = sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t));
    return {static_cast<float>(lr), static_cast<float>(1.0 - h.beta1), static_cast<float>(h.beta2),
            static_cast<float>(1.0 - h.beta2), static_cast<float>(h.eps), static_cast<float>(h.weight_decay),
            static_cast<float>(1.0 - lr * h.weight_decay), static_cast<float>(1.0 - pow(h.beta1, t)),
            static_cast<float>(sqrt(bias_correction2)), static_cast<float>(rho_t > 5.0 ? rect : 0.0), grad_mult,
            h.maximize ? -grad_mult : grad_mult, h.decoupled_weight_decay, rho_t > 5.0};
  }
  template <typename T>
  FA_HD void update(T& p, T g, T (&s)[kStates], const Coeffs& c) { radam_update(p, g, s[0], s[1], c); }
};

}  // namespace fused_amp::ops
