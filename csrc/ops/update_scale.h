#pragma once
#include "ops/common.h"

namespace fused_amp::ops {

struct ScaleUpdateArgs {
  double growth_factor;
  double backoff_factor;
  int growth_interval;
  int hysteresis;  // back off on the hysteresis-th overflow in a row (1: on every overflow)
  bool has_min_scale;
  bool has_max_scale;
  float min_scale;
  float max_scale;
};

// One scale update, as torch._amp_update_scale_ does it when hysteresis == 1 and there are no
// bounds: the products are formed in double and rounded to the fp32 scale; growth only to a
// finite value. `overflows_in_row` counts consecutive overflows; a clean step resets it.
FA_HD void update_scale(float& scale, int& growth_tracker, int& overflows_in_row, bool found_inf,
                        const ScaleUpdateArgs& a) {
  if (found_inf) {
    growth_tracker = 0;
    overflows_in_row += 1;
    if (overflows_in_row >= a.hysteresis) {
      float backed_off = static_cast<float>(scale * a.backoff_factor);
      if (a.has_min_scale && backed_off < a.min_scale) backed_off = a.min_scale;
      scale = backed_off;
    }
    return;
  }
  overflows_in_row = 0;
  const int successful = growth_tracker + 1;
  if (successful == a.growth_interval) {
    float grown = static_cast<float>(scale * a.growth_factor);
    if (is_finite(grown)) {
      if (a.has_max_scale && grown > a.max_scale) grown = a.max_scale;
      scale = grown;
    }
    growth_tracker = 0;
  } else {
    growth_tracker = successful;
  }
}

// ---- fp8 delayed scaling (TransformerEngine's DelayedScaling recipe) -------------------------

struct DelayedScalingArgs {
  float scaled_max;  // the fp8 format's largest value times 2^-margin, in fp32
  bool most_recent;  // amax_compute_algo "most_recent" (else "max")
};

// fmaxf's maximum: a NaN argument gives the other one.
FA_HD float max_ignoring_nan(float a, float b) { return (a != a || b > a) ? b : a; }

// The scale update of one fp8-scaled tensor, from its amax history (`length` values `stride`
// apart; entry 0 holds the amax seen since the last update) and its scale. `reduced`, when not
// null and nonzero, is that amax all-reduced over the ranks and stands for entry 0. An amax of 0
// (the tensor was not used) changes no history. Otherwise the history rolls by one (entry 0's
// amax becomes the newest entry, the oldest drops out, entry 0 restarts at 0), and the amax is
// the largest of the history (NaN entries ignored, as fmaxf ignores them) or, with
// `most_recent`, entry 0's. scale = scaled_max / amax where that amax is finite and positive,
// else it stays; an infinite scale (a tiny amax) becomes the largest fp32 value. scale_inv =
// 1 / scale.
FA_HD void delayed_scale_update(float* history, int64_t length, int64_t stride, const float* reduced,
                                float& scale, float& scale_inv, const DelayedScalingArgs& a) {
  const float last = reduced && *reduced != 0.f ? *reduced : history[0];
  float amax = 0.f;
  if (last != 0.f) {
    for (int64_t i = 0; i < length; ++i) {  // in place: entry i takes entry i + 1 before that one is written
      const float v = i + 1 < length ? history[(i + 1) * stride] : last;
      amax = max_ignoring_nan(amax, v);
      history[i * stride] = i > 0 ? v : 0.f;
    }
  }
  if (a.most_recent) amax = last;
  float s = is_finite(amax) && amax > 0.f ? a.scaled_max / amax : scale;
  if (!is_finite(s) && s == s) s = 3.402823466e38f;  // FLT_MAX
  scale = s;
  scale_inv = 1.f / s;
}

}  // namespace fused_amp::ops
