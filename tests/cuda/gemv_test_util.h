// Helpers shared by the GEMV tests (test_cuda_gemv*.cpp, test_gemv_attn_prep.cpp): a configuration's name
// for failure messages, and tactic caches holding GEMV tactics (what `kiln tune` would write).
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "ops/cuda/context.h"
#include "ops/cuda/fp8_gemm.h"
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

// The configurations the residual-norm prologue runs (gemv.h: gemv_norm_in_fusable): multi-tile ones too.
inline std::vector<cuda::GemvConfig> norm_in_gemv_configs() {
  std::vector<cuda::GemvConfig> v;
  for (const cuda::GemvConfig& c : cuda::kGemvConfigs)
    if (cuda::gemv_norm_in_fusable(c)) v.push_back(c);
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

// Writes a tactic cache for `eng` holding the W8A8 GEMM's first config for these (M bucket, N, K) FP8 shapes.
inline void write_w8a8_cache(const cuda::GemmEngine& eng, const std::string& path,
                             const std::vector<cuda::GemmShape>& shapes) {
  std::ofstream out(path);
  out << "kiln-gemm-tactics v5\nkey " << eng.key() << "\n";
  cuda::GemmTactic t;
  t.kind = cuda::GemmKind::fp8gemm;
  t.fp8gemm = cuda::kFp8GemmConfigs[0];
  t.us = 1.0f;
  t.describe = "w8a8";
  for (const cuda::GemmShape& s : shapes) out << cuda::format_tactic_line(s, t) << "\n";
}

// Installs `entries` (none: an empty tactic set, cuBLASLt's heuristic everywhere) as the tactics of the
// process's GEMM engine for the scope's life: the previous ones are saved into the test's scratch folder
// (`tag`) and loaded back at the end.
class EngineTacticsScope {
 public:
  EngineTacticsScope(const std::string& tag, const std::vector<GemvEntry>& entries) {
    cuda::GemmEngine& eng = cuda::gemm_engine();
    const auto dir = test_support::process_scratch_dir(tag);
    saved_ = (dir / "saved_tactics.txt").string();
    eng.save(saved_);
    const std::string path = (dir / "gemv_tactics.txt").string();
    write_gemv_cache(eng, path, entries);
    loaded_ = eng.load(path);
  }
  ~EngineTacticsScope() { cuda::gemm_engine().load(saved_); }
  EngineTacticsScope(const EngineTacticsScope&) = delete;
  EngineTacticsScope& operator=(const EngineTacticsScope&) = delete;
  bool loaded() const { return loaded_; }

 private:
  std::string saved_;
  bool loaded_ = false;
};

}  // namespace kiln::test
