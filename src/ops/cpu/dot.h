// The CPU references' fp32 dot product: 8 lane partials (element i into lane i mod 8, ascending i), then a
// pairwise tree ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). Shared by the attention references so
// their scores round alike.
#pragma once

#include <cstdint>

namespace kiln::ops::cpu {

inline float dot8(const float* a, const float* b, int64_t n) {
  float l[8] = {};
  for (int64_t i = 0; i < n; ++i) l[i % 8] += a[i] * b[i];
  const float s0 = l[0] + l[4], s1 = l[1] + l[5], s2 = l[2] + l[6], s3 = l[3] + l[7];
  return (s0 + s2) + (s1 + s3);
}

}  // namespace kiln::ops::cpu
