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

}  // namespace fused_amp::ops
