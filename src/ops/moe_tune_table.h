// The MoE expert-kernel tuner's pure parts (no CUDA): the shape it times, the times it measured, the
// threshold it picks from them, and its cache file. The timing is ops/cuda/moe_tune.h; applying the result at
// start, model/cuda_tune.h.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kiln::ops {

// One MoE layer's expert shape as a rank runs it: E router experts, `local` of them held (expert parallelism;
// local == E otherwise), top-k, hidden H, the rank's moe_intermediate I (tensor parallelism splits it), and
// whether the experts stay block-FP8 on the device (else bf16).
struct MoeTuneShape {
  int64_t E = 0, local = 0, k = 0, H = 0, I = 0;
  bool fp8 = false;
};

// The batch sizes timed: the gather GEMV against the grouped GEMM at each (whole moe_mlp calls).
inline constexpr int64_t kMoeTuneLadder[] = {1, 2, 4, 8, 16, 32, 64, 128};

// Median microseconds of one moe_mlp call at tokens[i] with each kernel.
struct MoeTuneTimes {
  std::vector<int64_t> tokens;
  std::vector<double> gemv_us, grouped_us;
};

// A grouped-GEMM time within this factor of the GEMV's counts as a win. Timed alone the two kernels misjudge
// the decode step near the crossover: 30B-A3B's FP8 experts on an H100 (2026-12-07, `69cacb3`, docs/PERF.md
// E14) timed 171.0 against the GEMV's 169.7 us at T = 8 alone, yet the W8A8 GEMM made the batch-8 step 0.45
// ms (5 % of its experts' time) faster; at T = 4 it timed 9 % slower alone and made the step 5 % slower.
inline constexpr double kMoeTuneGroupedMargin = 1.05;

// The smallest tokens[i] from which the grouped GEMM is as fast as the GEMV, within kMoeTuneGroupedMargin,
// at that T and at every larger T timed: a kernel that wins only at an isolated T in the middle of the ladder
// (noise, or a tile-count step) does not take the rows between. `never` when the GEMV wins at the ladder's
// largest T (or nothing was timed). tokens ascending.
inline int64_t moe_grouped_from(const MoeTuneTimes& t, int64_t never) {
  int64_t from = never;
  for (size_t i = t.tokens.size(); i-- > 0;) {
    if (!(t.grouped_us[i] <= kMoeTuneGroupedMargin * t.gemv_us[i])) break;
    from = t.tokens[i];
  }
  return from;
}

// A cache line's key: the GPU (its name, SM count), the shape, and `below`, the exclusive end of the
// thresholds the tuner could choose (the value meaning "the GEMV over the whole ladder").
struct MoeTuneKey {
  std::string gpu;  // cudaDeviceProp::name; spaces are written as '_'
  int64_t sms = 0;
  MoeTuneShape shape;
  int64_t below = 0;
  bool operator<(const MoeTuneKey& o) const { return text() < o.text(); }
  bool operator==(const MoeTuneKey& o) const { return text() == o.text(); }
  // "gpu=NVIDIA_H100_80GB_HBM3 sms=132 E=128 L=128 k=8 H=2048 I=768 experts=fp8 below=256"
  std::string text() const;
};

// A tuned shape: the first T (by rows) the grouped GEMM takes (block-FP8: the W8A8 one,
// moe_fp8_w8a8_min_tokens; bf16: the wgmma one, moe_gemv_max_tokens + 1), and the times it was chosen from
// (written as a comment; not read back).
struct MoeTuneEntry {
  int64_t grouped_from = 0;
  MoeTuneTimes times;
};

// The cache file: a format line (kMoeTuneCacheFormat), then one line per key, e.g.
//   gpu=NVIDIA_H100_80GB_HBM3 sms=132 E=128 L=128 k=8 H=2048 I=768 experts=fp8 below=256 grouped_from=8
// followed on the same line by "  # T 1 2 4 ...; gemv us ...; grouped us ..." (what the choice was made
// from). The version changes with the rule that chooses (v2: kMoeTuneGroupedMargin), so a cache chosen by
// another rule is re-tuned.
inline constexpr const char* kMoeTuneCacheFormat = "kiln moe thresholds v2";

std::string format_moe_tune_line(const MoeTuneKey& key, const MoeTuneEntry& e);
// False (key and e unspecified) for anything but a line format_moe_tune_line writes: a missing or extra
// field, a bad number, a threshold outside [1, below], sizes that are not positive.
bool parse_moe_tune_line(const std::string& line, MoeTuneKey& key, MoeTuneEntry& e);

using MoeTuneCache = std::map<MoeTuneKey, MoeTuneEntry>;
// The entries of the cache file at `path`; empty where there is none. A file of another format or with a
// malformed line is ignored whole (a warning naming it on stderr; the caller re-tunes and rewrites it).
MoeTuneCache load_moe_tune_cache(const std::string& path);
// Writes `cache` to `path` atomically (directories created). False, with a warning on stderr, where it
// cannot (a read-only location): the tuned values still apply to this process.
bool save_moe_tune_cache(const std::string& path, const MoeTuneCache& cache);
// The MoE cache beside the GEMM tactic cache: its path with ".moe" appended (so KILN_TUNE_CACHE, which moves
// the tactic cache, moves this one too, and two private tactic paths never share it).
std::string moe_tune_cache_path(const std::string& tactic_cache_path);

}  // namespace kiln::ops
