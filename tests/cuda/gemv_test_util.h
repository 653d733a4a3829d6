// Helpers shared by the GEMV tests (test_cuda_gemv*.cpp, test_gemv_attn_prep.cpp): a configuration's name
// for failure messages, and tactic caches holding GEMV tactics (what `kiln tune` would write).
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "ops/cuda/gemm.h"
#include "ops/cuda/gemv.h"

namespace kiln::test {

inline std::string gemv_config_name(cuda::GemvConfig c) {
  return std::string(c.tensor_cores ? "tensor-core" : "fma") + " warps " + std::to_string(c.warps) +
         (c.tiles > 1 ? " tiles " + std::to_string(c.tiles) : "");
}

// The configurations the fused forms run (gemv.h: gemv_fusable): the ones their tests cover.
inline std::vector<cuda::GemvConfig> fusable_gemv_configs() {
  std::vector<cuda::GemvConfig> v;
  for (const cuda::GemvConfig& c : cuda::kGemvConfigs)
    if (cuda::gemv_fusable(c)) v.push_back(c);
  return v;
}

// One GEMV tactic of a tactic cache: configuration cfg for shape s; norm_in: the tactic takes the residual
// add + RMSNorm in its prologue (cache word 2, "+norm-in").
struct GemvEntry {
  cuda::GemmShape s;
  cuda::GemvConfig cfg;
  bool norm_in = false;
};

// Writes a v2 tactic cache for `eng` holding these GEMV tactics (what `kiln tune` would write).
inline void write_gemv_cache(const cuda::GemmEngine& eng, const std::string& path,
                             const std::vector<GemvEntry>& entries) {
  std::ofstream out(path);
  out << "kiln-gemm-tactics v2\nkey " << eng.key() << "\n";
  for (const GemvEntry& e : entries) {
    cuda::GemmTactic t;
    t.kind = cuda::GemmKind::gemv;
    t.gemv = e.cfg;
    t.gemv_norm_in = e.norm_in;
    t.us = 1.0f;
    t.describe = gemv_config_name(e.cfg);
    out << cuda::format_tactic_line(e.s, t) << "\n";
  }
}
inline void write_gemv_cache(const cuda::GemmEngine& eng, const std::string& path, const cuda::GemmShape& s,
                             cuda::GemvConfig cfg, bool norm_in = false) {
  write_gemv_cache(eng, path, {{s, cfg, norm_in}});
}

}  // namespace kiln::test
