// gemv_fp8 benchmark: the small-M GEMV on block-FP8 weights (ops/cuda/gemv.h: e4m3 [N, K] + f32 128 x 128
// block scales, widened in registers) beside the same GEMV on bf16 weights, for the decode projections of
// Qwen3-4B (and with KILN_GEMM_BENCH_ONLY=8B Qwen3-8B: QKV, O, gate_up, down) at M = 1, 4 and 8: every config
// of both formats, the engine's choice for the FP8 weight with and without PDL (the tuned FP8 GEMV, else
// dequantize into scratch + the bf16 dispatch), and the fused gate_up + SiLU in the engine's FP8 config.
// The FP8 rows: the W8A16 GEMV ("e4m3 W tc/fma ...", gemv.h), its e4m3 x 16 format ("e4m3 W x16 fma ...",
// and its lighter form "e4m3 W x16 rows4 fma ...", gemv.h) and the W8A8 one ("e4m3 W w8a8 ...", gemv_w8a8.h),
// at M = 1, 4 and 8. Weights rotate over >= 4 copies that together exceed 2.2x the L2 (flushed before every
// sample), so every call reads W from HBM. Bytes = W (e4m3: N K + the scales; bf16: 2 N K) + x + out: the FP8
// rows move about half the bf16 rows'.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "bench/kernel_bench.h"
#include "kiln/tensor.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/context.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/gemv_w8a8.h"

namespace kiln::bench {
namespace {

namespace kc = ::kiln::cuda;

struct Fp8Case {
  const char* model;
  const char* name;
  int64_t n, k;
};

// Qwen3-4B: hidden 2560, 32/8 heads of 128, intermediate 9728. Qwen3-8B: hidden 4096, 32/8 heads of 128,
// intermediate 12288.
const Fp8Case kFp8Cases[] = {{"4B", "qkv", 6144, 2560},      {"4B", "o", 2560, 4096},
                             {"4B", "gate_up", 19456, 2560}, {"4B", "down", 2560, 9728},
                             {"8B", "qkv", 6144, 4096},      {"8B", "o", 4096, 4096},
                             {"8B", "gate_up", 24576, 4096}, {"8B", "down", 4096, 12288}};

// KILN_GEMM_BENCH_ONLY=TEXT: only the rows whose shape contains TEXT (as the gemm bench); unset: the 4B
// shapes (the whole table would take minutes).
bool selected(const std::string& shape) {
  const char* v = std::getenv("KILN_GEMM_BENCH_ONLY");
  return (!v || !*v) ? shape.rfind("4B ", 0) == 0 : shape.find(v) != std::string::npos;
}

std::string cfg_name(const char* what, kc::GemvConfig c) {
  if (c.e4m3x16)  // the e4m3 x 16 format (gemv.h): 16-byte e4m3 chunks, FMA kernel, 8 rows a block at M <= 2
    // ("x16 fma"), or the lighter form's 4 ("x16 rows4 fma")
    return std::string(what) + (c.x16_rows == 4 ? " x16 rows4 fma w" : " x16 fma w") +
           std::to_string(c.warps);
  if (c.w8a8)  // the W8A8 kernel (gemv_w8a8.h): 16-row tiles, K blocks in flight
    return std::string(what) + " w8a8 w" + std::to_string(c.warps) + " x" + std::to_string(c.tiles) + " kb" +
           std::to_string(c.w8a8);
  return std::string(what) + (c.tensor_cores ? " tc" : " fma") + " w" + std::to_string(c.warps) +
         (c.tiles > 1 ? " x" + std::to_string(c.tiles) : "");
}

void run_gemv_fp8(const Env& env, std::vector<Row>& rows) {
  kc::GemmEngine& eng = kc::gemm_engine();
  const Device dev = Device::cuda();
  constexpr int64_t kMs[] = {1, 4, 8};
  for (const Fp8Case& c : kFp8Cases) {
    const auto shape_of = [&](int64_t M) {
      return std::string(c.model) + " " + c.name + " M=" + std::to_string(M) + " N=" + std::to_string(c.n) +
             " K=" + std::to_string(c.k);
    };
    if (std::none_of(std::begin(kMs), std::end(kMs), [&](int64_t M) { return selected(shape_of(M)); }))
      continue;
    const size_t q_bytes = size_t(c.n * c.k), bf_bytes = 2 * q_bytes;
    const size_t s_bytes = size_t((c.n + 127) / 128 * ((c.k + 127) / 128)) * 4;
    const size_t copies = std::max<size_t>(4, (env.l2_bytes * 22 / 10 + q_bytes - 1) / q_bytes);
    std::vector<Buffer> q, s, bf;
    for (size_t i = 0; i < copies; ++i) {
      // Random bytes as e4m3 codes (the odd NaN code costs the same arithmetic), scales 0.0115.
      q.emplace_back(q_bytes, dev);
      kc::fill_random_bf16(q.back().data(), int64_t(q_bytes / 2), 2000 + i, 1.0f, 0.0f, env.stream);
      s.emplace_back(s_bytes, dev);
      KILN_CUDA_CHECK(cudaMemsetAsync(s.back().data(), 0x3c, s_bytes, env.stream));
      bf.emplace_back(bf_bytes, dev);
      kc::fill_random_bf16(bf.back().data(), c.n * c.k, 3000 + i, 0.05f, 0.0f, env.stream);
    }
    const int64_t M8 = kc::kGemvMaxM;
    Buffer x(size_t(M8 * c.k) * 2, dev), out(size_t(M8 * c.n) * 2, dev);
    kc::fill_random_bf16(x.data(), M8 * c.k, 7, 1.0f, 0.0f, env.stream);
    KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
    const auto fp8_w = [&](int i) {
      const size_t j = size_t(i) % copies;
      return kc::GemvWeight{q[j].data(), c.k, static_cast<const float*>(s[j].data())};
    };
    const auto bf_w = [&](int i) { return kc::GemvWeight{bf[size_t(i) % copies].data(), c.k, nullptr}; };
    const bool gate_up = std::string(c.name) == "gate_up";
    for (const int64_t M : kMs) {
      const std::string shape = shape_of(M);
      if (!selected(shape)) continue;
      const double io = double(M * c.k) * 2 + double(M * c.n) * 2;
      const double fp8_bytes = double(q_bytes + s_bytes) + io, bf_bytes_row = double(bf_bytes) + io;
      auto time_row = [&](Row r, const std::function<void(int)>& launch) {
        launch(0);  // eager first call: lazy module loading, scratch
        KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
        time_graph_row(env, launch, int(copies), r);
        rows.push_back(r);
      };
      for (const kc::GemvConfig cfg : kc::kGemvConfigs) {
        time_row(Row{"gemv_fp8", cfg_name("bf16 W", cfg), shape, 0, -1, bf_bytes_row, "forced"}, [&](int i) {
          kc::gemv(x.data(), c.k, bf_w(i), out.data(), c.n, M, c.n, c.k, kc::GemvEpilogue::bf16, cfg,
                   env.stream);
        });
        time_row(Row{"gemv_fp8", cfg_name("e4m3 W", cfg), shape, 0, -1, fp8_bytes, "forced"}, [&](int i) {
          kc::gemv(x.data(), c.k, fp8_w(i), out.data(), c.n, M, c.n, c.k, kc::GemvEpilogue::bf16, cfg,
                   env.stream);
        });
      }
      // The e4m3 x 16 format (16-byte chunks, exact integer decode, the block scale on each chunk's sum).
      if (c.k % 16 == 0)
        for (const kc::GemvConfig cfg : kc::kGemvE4m3x16Configs)
          time_row(Row{"gemv_fp8", cfg_name("e4m3 W", cfg), shape, 0, -1, fp8_bytes, "forced"}, [&](int i) {
            kc::gemv(x.data(), c.k, fp8_w(i), out.data(), c.n, M, c.n, c.k, kc::GemvEpilogue::bf16, cfg,
                     env.stream);
          });
      // The W8A8 GEMV (x quantized in each block: the same bytes moved, fewer instructions a byte).
      if (kc::gemv_w8a8_supported(M, c.n, c.k, c.k, c.k, c.n, kc::GemvEpilogue::bf16))
        for (const kc::GemvConfig cfg : kc::kGemvW8a8Configs)
          time_row(Row{"gemv_fp8", cfg_name("e4m3 W", cfg), shape, 0, -1, fp8_bytes, "forced"}, [&](int i) {
            kc::gemv(x.data(), c.k, fp8_w(i), out.data(), c.n, M, c.n, c.k, kc::GemvEpilogue::bf16, cfg,
                     env.stream);
          });
      const auto choice = eng.gemv_choice(M, c.n, c.k, kc::GemmOut::bf16, kc::GemmWeight::fp8);
      const std::string chosen = choice ? cfg_name("gemv", *choice) : "no FP8 GEMV tactic: dequantize + bf16";
      for (const bool pdl : {false, true}) {
        time_row(Row{"gemv_fp8", pdl ? "e4m3 W engine choice+pdl" : "e4m3 W engine choice", shape, 0, -1,
                     fp8_bytes, chosen},
                 [&](int i) {
                   eng.run(x.data(), c.k, fp8_w(i), out.data(), c.n, M, c.n, c.k, kc::GemmOut::bf16,
                           env.stream, pdl);
                 });
      }
      if (gate_up) {
        // The fused gate_up + SiLU in the engine's FP8 config, and with e4m3 x 16, 4 warps (both forms).
        const kc::GemvConfig pc = choice ? *choice : kc::GemvConfig{8, true};
        const double fused_bytes = double(q_bytes + s_bytes) + double(M * c.k) * 2 + double(M * c.n / 2) * 2;
        const std::pair<kc::GemvConfig, const char*> fused[] = {
            {pc, choice ? "engine choice" : "no FP8 GEMV tactic: default"},
            {kc::kGemvE4m3x16Configs[1], "forced"},
            {kc::kGemvE4m3x16Configs[5], "forced"}};
        for (const auto& [fc, why] : fused)
          time_row(
              Row{"gemv_fp8", cfg_name("e4m3 W fused gemv+silu+pdl", fc), shape, 0, -1, fused_bytes, why},
              [&](int i) {
                kc::gemv(x.data(), c.k, fp8_w(i), out.data(), c.n / 2, M, c.n, c.k,
                         kc::GemvEpilogue::silu_mul, fc, env.stream, true);
              });
      }
    }
  }
}

}  // namespace

KILN_KERNEL_BENCH(
    "gemv_fp8", "decode GEMV on block-FP8 weights beside bf16 weights (Qwen3-4B, 8B projections; M 1, 4, 8)",
    run_gemv_fp8);

}  // namespace kiln::bench
