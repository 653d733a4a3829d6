// Helpers shared by the GEMV tests (test_cuda_gemv*.cpp, test_gemv_attn_prep.cpp): a configuration's name
// for failure messages, and a tactic cache holding one GEMV tactic (what `kiln tune` would write).
#pragma once

#include <fstream>
#include <string>

#include "ops/cuda/gemm.h"
#include "ops/cuda/gemv.h"

namespace kiln::test {

inline std::string gemv_config_name(cuda::GemvConfig c) {
  return std::string(c.tensor_cores ? "tensor-core" : "fma") + " warps " + std::to_string(c.warps);
}

// Writes a v2 tactic cache for `eng` holding one GEMV tactic (configuration cfg) for shape s; norm_in: the
// tactic takes the residual add + RMSNorm in its prologue (cache word 2, "+norm-in").
inline void write_gemv_cache(const cuda::GemmEngine& eng, const std::string& path, const cuda::GemmShape& s,
                             cuda::GemvConfig cfg, bool norm_in = false) {
  cuda::GemmTactic t;
  t.kind = cuda::GemmKind::gemv;
  t.gemv = cfg;
  t.gemv_norm_in = norm_in;
  t.us = 1.0f;
  t.describe = gemv_config_name(cfg);
  std::ofstream(path) << "kiln-gemm-tactics v2\nkey " << eng.key() << "\n"
                      << cuda::format_tactic_line(s, t) << "\n";
}

}  // namespace kiln::test
