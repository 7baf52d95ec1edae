#pragma once
// Many tensors seen as one flat range of elements, so that a parallel loop can split the work
// evenly however the sizes are spread (one embedding and a thousand biases alike).
#include <algorithm>
#include <cstdint>
#include <vector>

namespace fused_amp::core {

// offsets[t] is where tensor t starts in the flat range; offsets.back() is the total.
inline std::vector<int64_t> flat_offsets(const std::vector<int64_t>& numels) {
  std::vector<int64_t> offsets(numels.size() + 1, 0);
  for (size_t t = 0; t < numels.size(); ++t) offsets[t + 1] = offsets[t] + numels[t];
  return offsets;
}

// Calls f(t, begin, end) with tensor-local bounds for each tensor overlapping [begin, end).
template <class F>
void for_each_part(const std::vector<int64_t>& offsets, int64_t begin, int64_t end, F&& f) {
  size_t t = std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin() - 1;
  while (begin < end) {
    while (offsets[t + 1] <= begin) ++t;  // empty tensors
    const int64_t stop = std::min(end, offsets[t + 1]);
    f(t, begin - offsets[t], stop - offsets[t]);
    begin = stop;
  }
}

}  // namespace fused_amp::core
