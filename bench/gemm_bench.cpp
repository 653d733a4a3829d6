// gemm benchmark: the decode GEMMs of Qwen3-4B and Qwen3-0.6B (QKV, O, gate_up, down, LM head), the 8B down
// and the 30B-A3B QKV and O, at M = 1, 4, 8: cuBLASLt (the tuned tactic when the cache has a cuBLASLt one for
// the shape, else the heuristic's first), kiln's GEMV in every configuration (FMA or tensor-core kernel,
// block size), the engine's own choice (what the model runs; also with
// PDL, where the amortized column shows back-to-back GEMVs prefetching W while the previous one drains), for
// gate_up the fused GEMV + SiLU-and-mul against cuBLASLt + the silu_mul kernel, and for O and down the GEMV
// with the add + RMSNorm epilogue against the GEMV (or cuBLASLt) + the rms_norm kernel (add), in every
// configuration, and with PDL in the engine's configuration. Weights are rotated over
// >= 4 copies that together exceed 2.2x the L2 (and the L2 is flushed before every sample), so every call
// reads W from HBM. Timed as graph replays, plus "amortized": 16 launches over rotating copies in one graph /
// 16 (back to back, as in a decode step). Bytes = W + x + out (W dominates).
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/kernel_bench.h"
#include "kiln/tensor.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/context.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/gemv.h"

namespace kiln::bench {
namespace {

// KILN_GEMM_BENCH_ONLY=TEXT: only the rows whose shape ("4B down M=8 N=2560 K=9728") contains TEXT (one
// shape under ncu: the whole table passes hundreds of graph launches through the profiler).
bool shape_selected(const std::string& shape) {
  const char* v = std::getenv("KILN_GEMM_BENCH_ONLY");
  return !v || !*v || shape.find(v) != std::string::npos;
}

namespace kc = ::kiln::cuda;

struct GemmCase {
  const char* model;
  const char* name;
  int64_t n, k;
  kc::GemmOut out;
};

// Qwen3-4B: hidden 2560, 32 x 128 Q, 8 x 128 KV, intermediate 9728. Qwen3-0.6B: hidden 1024, 16 x 128 Q,
// 8 x 128 KV, intermediate 3072. Vocabulary 151936 (tied LM head, f32 logits). Qwen3-8B: hidden 4096,
// intermediate 12288. Qwen3-30B-A3B: hidden 2048, 32 x 128 Q, 4 x 128 KV.
const GemmCase kCases[] = {
    {"4B", "qkv", 6144, 2560, kc::GemmOut::bf16},      {"4B", "o", 2560, 4096, kc::GemmOut::bf16},
    {"4B", "gate_up", 19456, 2560, kc::GemmOut::bf16}, {"4B", "down", 2560, 9728, kc::GemmOut::bf16},
    {"4B", "lm_head", 151936, 2560, kc::GemmOut::f32}, {"0.6B", "qkv", 4096, 1024, kc::GemmOut::bf16},
    {"0.6B", "o", 1024, 2048, kc::GemmOut::bf16},      {"0.6B", "gate_up", 6144, 1024, kc::GemmOut::bf16},
    {"0.6B", "down", 1024, 3072, kc::GemmOut::bf16},   {"0.6B", "lm_head", 151936, 1024, kc::GemmOut::f32},
    {"8B", "down", 4096, 12288, kc::GemmOut::bf16},    {"30B", "qkv", 5120, 2048, kc::GemmOut::bf16},
    {"30B", "o", 2048, 4096, kc::GemmOut::bf16}};

std::string config_name(const char* what, kc::GemvConfig c) {
  return std::string(what) + (c.tensor_cores ? " tc" : " fma") + " w" + std::to_string(c.warps) +
         (c.tiles > 1 ? " x" + std::to_string(c.tiles) : "");
}

void run_gemm(const Env& env, std::vector<Row>& rows) {
  kc::GemmEngine& eng = kc::gemm_engine();  // holds the tactic cache, when one exists for this GPU
  const bool gemv_on = eng.gemv_enabled();  // KILN_GEMV=0 keeps the engine's choice rows on cuBLASLt
  const Device dev = Device::cuda();
  constexpr int64_t kMs[] = {1, 4, 8};
  const auto shape_of = [](const GemmCase& c, int64_t M) {
    return std::string(c.model) + " " + c.name + " M=" + std::to_string(M) + " N=" + std::to_string(c.n) +
           " K=" + std::to_string(c.k);
  };
  for (const GemmCase& c : kCases) {
    if (std::none_of(std::begin(kMs), std::end(kMs),
                     [&](int64_t M) { return shape_selected(shape_of(c, M)); }))
      continue;  // no row of this case is asked for: no weights either
    const bool gate_up = std::string(c.name) == "gate_up";
    const size_t w_bytes = size_t(c.n * c.k) * 2;
    const size_t copies = std::max<size_t>(4, (env.l2_bytes * 22 / 10 + w_bytes - 1) / w_bytes);
    std::vector<Buffer> w;
    for (size_t i = 0; i < copies; ++i) {
      w.emplace_back(w_bytes, dev);
      kc::fill_random_bf16(w.back().data(), c.n * c.k, 1000 + i, 0.05f, 0.0f, env.stream);
    }
    const int64_t M8 = kc::kGemvMaxM;
    Buffer x(size_t(M8 * c.k) * 2, dev), out(size_t(M8 * c.n) * 4, dev), act(size_t(M8 * c.n) * 2, dev);
    kc::fill_random_bf16(x.data(), M8 * c.k, 7, 1.0f, 0.0f, env.stream);
    // O and down: the residual and the next RMSNorm's weight and output (residual [M, n] is rewritten by
    // every launch; its values drift, which does not change the timing).
    const bool add_norm = std::string(c.name) == "o" || std::string(c.name) == "down";
    Buffer residual(add_norm ? size_t(M8 * c.n) * 2 : 16, dev), norm_w(add_norm ? size_t(c.n) * 2 : 16, dev),
        normed(add_norm ? size_t(M8 * c.n) * 2 : 16, dev);
    if (add_norm) {
      kc::fill_random_bf16(residual.data(), M8 * c.n, 8, 1.0f, 0.0f, env.stream);
      kc::fill_random_bf16(norm_w.data(), c.n, 9, 0.25f, 1.0f, env.stream);
    }
    // QKV and gate_up: their input is rms_norm(residual + delta), the previous projection's output added
    // (the add + RMSNorm kernel then the GEMV, vs the GEMV with the residual-norm prologue).
    const bool norm_in = std::string(c.name) == "qkv" || gate_up;
    Buffer ni_delta(norm_in ? size_t(M8 * c.k) * 2 : 16, dev),
        ni_res(norm_in ? size_t(M8 * c.k) * 2 : 16, dev), ni_w(norm_in ? size_t(c.k) * 2 : 16, dev),
        ni_normed(norm_in ? size_t(M8 * c.k) * 2 : 16, dev);
    if (norm_in) {
      kc::fill_random_bf16(ni_delta.data(), M8 * c.k, 10, 1.0f, 0.0f, env.stream);
      kc::fill_random_bf16(ni_res.data(), M8 * c.k, 11, 1.0f, 0.0f, env.stream);
      kc::fill_random_bf16(ni_w.data(), c.k, 12, 0.25f, 1.0f, env.stream);
    }
    KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
    for (const int64_t M : kMs) {
      const std::string shape = shape_of(c, M);
      if (!shape_selected(shape)) continue;
      const double osz = c.out == kc::GemmOut::f32 ? 4 : 2;
      const double io = double(M * c.k) * 2;
      const auto tuned = eng.tactics().find(kc::GemmShape{kc::gemm_m_bucket(M), c.n, c.k, c.out});
      const bool tuned_lt = tuned != eng.tactics().end() && tuned->second.kind == kc::GemmKind::cublaslt;
      const auto choice = eng.gemv_choice(M, c.n, c.k, c.out);
      const std::string lt_path = tuned_lt ? "tuned: " + tuned->second.describe : "heuristic";
      const std::string chosen = choice ? config_name("gemv", *choice) : lt_path;
      auto time_row = [&](Row r, const std::function<void(int)>& launch) {
        launch(0);  // eager first call: plans, lazy module loading
        KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
        time_graph_row(env, launch, int(copies), r);
        rows.push_back(r);
      };
      auto wi = [&](int i) { return w[size_t(i) % copies].data(); };
      const double plain_bytes = double(w_bytes) + io + double(M * c.n) * osz;

      eng.set_gemv_enabled(false);
      time_row(Row{"gemm", "cublaslt", shape, 0, -1, plain_bytes, lt_path}, [&](int i) {
        eng.run(x.data(), c.k, wi(i), c.k, out.data(), c.n, M, c.n, c.k, c.out, env.stream);
      });
      eng.set_gemv_enabled(gemv_on);
      for (const kc::GemvConfig cfg : kc::kGemvConfigs) {
        time_row(Row{"gemm", config_name("gemv", cfg), shape, 0, -1, plain_bytes, "forced"}, [&](int i) {
          kc::gemv(x.data(), c.k, wi(i), c.k, out.data(), c.n, M, c.n, c.k,
                   c.out == kc::GemmOut::f32 ? kc::GemvEpilogue::f32 : kc::GemvEpilogue::bf16, cfg,
                   env.stream);
        });
      }
      for (const bool pdl : {false, true}) {
        time_row(Row{"gemm", pdl ? "engine choice+pdl" : "engine choice", shape, 0, -1, plain_bytes, chosen},
                 [&](int i) {
                   eng.run(x.data(), c.k, wi(i), c.k, out.data(), c.n, M, c.n, c.k, c.out, env.stream, pdl);
                 });
      }
      if (add_norm) {
        // O / down + residual add + RMSNorm: two launches (cuBLASLt or the GEMV into tmp, then rms_norm with
        // add) vs the GEMV whose last block runs the add + RMSNorm. Bytes: W, x, tmp, residual read and
        // written, normed (the norm weight is negligible).
        const double an_bytes = double(w_bytes) + io + double(M * c.n) * 2 * 4;
        const float eps = 1e-6f;
        auto norm = [&](bool pdl) {
          kc::rms_norm(out.data(), c.n, residual.data(), c.n, norm_w.data(), normed.data(), c.n, M, c.n, eps,
                       true, env.stream, pdl);
        };
        auto fused = [&](int i, kc::GemvConfig cfg, bool pdl) {
          kc::gemv_add_rms_norm(x.data(), c.k, wi(i), c.k, out.data(), c.n, residual.data(), c.n,
                                norm_w.data(), normed.data(), c.n, M, c.n, c.k, eps, cfg, env.stream, pdl);
        };
        eng.set_gemv_enabled(false);
        time_row(Row{"gemm", "cublaslt+add_rms_norm", shape, 0, -1, an_bytes, lt_path + " + rms_norm"},
                 [&](int i) {
                   eng.run(x.data(), c.k, wi(i), c.k, out.data(), c.n, M, c.n, c.k, kc::GemmOut::bf16,
                           env.stream);
                   norm(false);
                 });
        eng.set_gemv_enabled(gemv_on);
        for (const kc::GemvConfig cfg : kc::kGemvConfigs) {
          if (!kc::gemv_fusable(cfg)) continue;
          time_row(Row{"gemm", config_name("gemv+add_rms_norm", cfg), shape, 0, -1, an_bytes, "forced"},
                   [&](int i) {
                     kc::gemv(x.data(), c.k, wi(i), c.k, out.data(), c.n, M, c.n, c.k, kc::GemvEpilogue::bf16,
                              cfg, env.stream);
                     norm(false);
                   });
          time_row(Row{"gemm", config_name("fused gemv+add_rms_norm", cfg), shape, 0, -1, an_bytes, "forced"},
                   [&](int i) { fused(i, cfg, false); });
        }
        // With PDL, in the engine's configuration (the tensor-core kernel with 8 warps when it has none).
        const kc::GemvConfig pc = choice && kc::gemv_fusable(*choice) ? *choice : kc::GemvConfig{8, true};
        const std::string pc_note = choice ? "engine choice" : "no GEMV tactic: default";
        time_row(Row{"gemm", config_name("gemv+add_rms_norm+pdl", pc), shape, 0, -1, an_bytes, pc_note},
                 [&](int i) {
                   kc::gemv(x.data(), c.k, wi(i), c.k, out.data(), c.n, M, c.n, c.k, kc::GemvEpilogue::bf16,
                            pc, env.stream, true);
                   norm(true);
                 });
        time_row(Row{"gemm", config_name("fused gemv+add_rms_norm+pdl", pc), shape, 0, -1, an_bytes, pc_note},
                 [&](int i) { fused(i, pc, true); });
      }
      if (norm_in) {
        // Bytes: W, delta and residual read, residual written, the output (act for gate_up).
        const int64_t cols = gate_up ? c.n / 2 : c.n;
        const double ni_bytes = double(w_bytes) + double(M * c.k) * 2 * 3 + double(M * cols) * 2;
        const kc::GemvEpilogue epi = gate_up ? kc::GemvEpilogue::silu_mul : kc::GemvEpilogue::bf16;
        void* dst = gate_up ? act.data() : out.data();
        const kc::GemvConfig pc =
            choice && kc::gemv_norm_in_fusable(*choice) ? *choice : kc::GemvConfig{8, true};
        const std::string note = choice ? "engine choice" : "no GEMV tactic: default";
        time_row(Row{"gemm", config_name(gate_up ? "add_rms_norm+gemv+silu" : "add_rms_norm+gemv", pc), shape,
                     0, -1, ni_bytes, note},
                 [&](int i) {
                   kc::rms_norm(ni_delta.data(), c.k, ni_res.data(), c.k, ni_w.data(), ni_normed.data(), c.k,
                                M, c.k, 1e-6f, true, env.stream, false);
                   kc::gemv(ni_normed.data(), c.k, wi(i), c.k, dst, cols, M, c.n, c.k, epi, pc, env.stream);
                 });
        // The fused kernel for every one-tile config (M = 1; at M > 1 the engine's) and block sizing (0: one
        // wave; g: g groups a block).
        for (const kc::GemvConfig cfg : kc::kGemvConfigs) {
          if (M > 1 ? !(cfg == pc) : !kc::gemv_fusable(cfg)) continue;
          for (const int g : {0, 2, 3}) {
            const std::string what =
                std::string("gemv_norm_in") + (gate_up ? "+silu" : "") + " g" + std::to_string(g);
            time_row(Row{"gemm", config_name(what.c_str(), cfg), shape, 0, -1, ni_bytes,
                         cfg == pc ? note : "forced"},
                     [&](int i) {
                       kc::gemv_norm_in(ni_delta.data(), c.k, ni_res.data(), c.k, ni_w.data(), 1e-6f, wi(i),
                                        c.k, dst, cols, M, c.n, c.k, epi, cfg, env.stream, false, g);
                     });
          }
        }
        // The fused kernel with PDL, as the decode graphs launch it, in the engine's configuration.
        time_row(Row{"gemm", config_name(gate_up ? "gemv_norm_in+silu+pdl" : "gemv_norm_in+pdl", pc), shape,
                     0, -1, ni_bytes, note},
                 [&](int i) {
                   kc::gemv_norm_in(ni_delta.data(), c.k, ni_res.data(), c.k, ni_w.data(), 1e-6f, wi(i), c.k,
                                    dst, cols, M, c.n, c.k, epi, pc, env.stream, true);
                 });
      }
      if (!gate_up) continue;
      // gate_up + SiLU-and-mul: two launches (cuBLASLt into gate_up, then silu_mul) vs the fused GEMV.
      const int64_t I = c.n / 2;
      const double fused_bytes = double(w_bytes) + io + double(M * I) * 2;
      eng.set_gemv_enabled(false);
      time_row(
          Row{"gemm", "cublaslt+silu_mul", shape, 0, -1, fused_bytes, lt_path + " + silu_mul"}, [&](int i) {
            eng.run(x.data(), c.k, wi(i), c.k, out.data(), c.n, M, c.n, c.k, kc::GemmOut::bf16, env.stream);
            kc::silu_mul(out.data(), c.n, act.data(), I, M, I, env.stream);
          });
      eng.set_gemv_enabled(gemv_on);
      for (const kc::GemvConfig cfg : kc::kGemvConfigs) {
        time_row(Row{"gemm", config_name("fused gemv+silu", cfg), shape, 0, -1, fused_bytes, "forced"},
                 [&](int i) {
                   kc::gemv(x.data(), c.k, wi(i), c.k, act.data(), I, M, c.n, c.k, kc::GemvEpilogue::silu_mul,
                            cfg, env.stream);
                 });
      }
    }
  }
}

}  // namespace

KILN_KERNEL_BENCH("gemm",
                  "decode GEMMs (Qwen3-4B, 0.6B; M 1, 4, 8): cuBLASLt vs kiln GEMV vs fused gate_up+SiLU, "
                  "O/down+add+RMSNorm and add+RMSNorm+QKV/gate_up",
                  run_gemm);

}  // namespace kiln::bench
