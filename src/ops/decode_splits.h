// The split-KV choice of the tensor-core decode kernel (ops/cuda/attention.cu, decode v3) at large batch,
// as plain integer arithmetic (host only; unit-tested on the CPU, tests/unit/test_decode_splits.cpp).
//
// Model. The (sequence, KV head) pairs are split into s chunks each: pairs * s blocks of equal work w =
// ceil(tiles / s) + 2 tiles (the + 2: a block's fixed cost, its Q load, its first tile's latency and its
// share of the combine), spread evenly over `sms` SMs that hold `per_sm` blocks at a time. A block's tiles
// stream one after another, so an SM runs ceil(m / per_sm) rounds of w for its m blocks, and a last round
// with fewer than per_sm blocks takes as long as a full one (the busiest SM, m = ceil(pairs * s / sms), sets
// the time). The smallest cost over s = 1 .. cap wins, ties keeping fewer splits.
// H200 (132 SMs), fp8 cache (3 blocks an SM, 80 tiles of 128 keys in a 10240-token table), measured with
// forced splits 1 / 2 / 3 / 4 / 6 (docs/PERF.md): B = 64 376 / 324 / 308 / 321 / 312 us -> 3 splits, B = 128
// 630 / 615 / 600 / 606 / 604 us -> 3. The decode launcher applies it to fp8 caches (bf16 measured one split
// best at B = 64 and 128, which the model picks too).
#pragma once

#include <algorithm>
#include <cstdint>

namespace kiln::ops {

// The split count in [1, cap] the model above picks (cap < 1 is taken as 1; per_sm < 1 as 1).
inline int decode_wave_splits(int64_t pairs, int cap, int64_t sms, int64_t per_sm, int64_t tiles) {
  per_sm = std::max<int64_t>(per_sm, 1);
  int best = 1;
  int64_t best_cost = -1;
  for (int s = 1; s <= std::max(cap, 1); ++s) {
    const int64_t m = (pairs * s + sms - 1) / sms, rounds = (m + per_sm - 1) / per_sm;
    const int64_t cost = rounds * ((tiles + s - 1) / s + 2);
    if (best_cost < 0 || cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

}  // namespace kiln::ops
