// The split-KV choice of the tensor-core decode kernel (ops/cuda/attention.cu, decode v3) at large batch,
// as plain integer arithmetic (host only; unit-tested on the CPU, tests/unit/test_decode_splits.cpp).
//
// Model. The (sequence, KV head) pairs are split into s chunks each: pairs * s blocks of equal work w =
// ceil(tiles / s) + 1 tiles (the + 1: a block's fixed cost, its Q load and its first tile's latency),
// spread evenly over `sms` SMs that hold `per_sm` blocks at a time. Decode is bandwidth-bound and an SM's
// bandwidth is saturated from 2 resident blocks on (one block alone pulls about half of it), so an SM given
// m blocks takes floor(m / per_sm) rounds of per_sm * w / min(per_sm, 2), plus r * w / min(r, 2) for the
// r = m mod per_sm left. The busiest SM (m = ceil(pairs * s / sms)) sets the time; s > 1 adds the combine
// launch (one tile). The smallest cost over s = 1 .. cap wins, ties keeping fewer splits.
// H200 (132 SMs), fp8 cache (3 blocks an SM, 80 tiles of 128 keys in a 10240-token table): B = 64 -> 2
// splits (measured 388 us against 438 with one), B = 128 -> 1 (739 us; 745 with 3): docs/PERF.md. The decode
// launcher applies it to fp8 caches only (the lone-block premise was fitted to the ALU-bound fp8 kernel).
#pragma once

#include <algorithm>
#include <cstdint>

namespace kiln::ops {

// Time, in units of half a saturated block, of one SM that runs m blocks of w tiles, per_sm at a time.
inline int64_t decode_sm_time(int64_t m, int64_t w, int64_t per_sm) {
  const int64_t r = m % per_sm;
  return (m / per_sm) * per_sm * w * 2 / std::min<int64_t>(per_sm, 2) +
         (r > 0 ? r * w * 2 / std::min<int64_t>(r, 2) : 0);
}

// The split count in [1, cap] the model above picks (cap < 1 is taken as 1).
inline int decode_wave_splits(int64_t pairs, int cap, int64_t sms, int64_t per_sm, int64_t tiles) {
  int best = 1;
  int64_t best_cost = -1;
  for (int s = 1; s <= std::max(cap, 1); ++s) {
    const int64_t m = (pairs * s + sms - 1) / sms, w = (tiles + s - 1) / s + 1;
    const int64_t cost = decode_sm_time(m, w, std::max<int64_t>(per_sm, 1)) + (s > 1 ? 2 : 0);
    if (best_cost < 0 || cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

}  // namespace kiln::ops
