// fp8_gemm benchmark: the W8A8 block-FP8 GEMM (ops/cuda/fp8_gemm.h) on the Qwen3-4B projections at M = 1024,
// 4096, 8192, beside cuBLASLt's FP8 GEMM with per-tensor scales (e4m3 x e4m3, bf16 out: the tensor cores'
// ceiling for FP8 with the scaling outside the K loop; with and without its fast accumulation) and the bf16
// cuBLASLt GEMM (the engine's tactic or heuristic). Rows: our GEMM alone on quantized activations, in every
// config; the quantizer alone; both as fp8_gemm runs them (best config). Cold L2 before every sample (the
// inputs fit in the L2, so each sample reads them from HBM once). A TFLOP/s table (2 M N K / time) follows.
// At M >= 4096 on down and gate_up, the producer of the input with it: the unfused producer (silu_mul; the
// add + rms_norm) then fp8_gemm, against the fused producer writing the workspace (fp8_act_producers.h) then
// fp8_gemm_quantized (issue 43), in the best config; a second table gives both in TFLOP/s.
// Decode sizes M = 16, 32, 64 (issue 43: the unsplit tiles leave most SMs idle): every config (the split-K
// ones included; at M >= 1024 they clamp to the unsplit kernel and are not timed), the dequantize + cuBLASLt
// bf16 path the tuner weighs them against, and cuBLASLt bf16 on a bf16 weight; these rows count only the
// weight's bytes (e4m3: N K, bf16: 2 N K), so their GB/s is the weight stream's. A third table: the fastest
// unsplit and split config beside both, in µs.
// KILN_GEMM_BENCH_ONLY=TEXT keeps the shapes containing TEXT, as in gemm_bench.cpp ("M=32 ": one M).
#include <cublasLt.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "bench/kernel_bench.h"
#include "kiln/cuda_check.h"
#include "kiln/error.h"
#include "kiln/tensor.h"
#include "ops/cuda/context.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/fp8_act_producers.h"
#include "ops/cuda/fp8_dequant.h"
#include "ops/cuda/fp8_gemm.h"
#include "ops/cuda/gemm.h"

namespace kiln::bench {
namespace {

namespace kc = ::kiln::cuda;

#define KILN_LT_CHECK(expr)                                                              \
  do {                                                                                   \
    const cublasStatus_t st_ = (expr);                                                   \
    KILN_CHECK(st_ == CUBLAS_STATUS_SUCCESS, #expr " failed: cublas status ", int(st_)); \
  } while (0)

bool selected(const std::string& shape) {
  const char* v = std::getenv("KILN_GEMM_BENCH_ONLY");
  return !v || !*v || shape.find(v) != std::string::npos;
}

struct Proj {
  const char* name;
  int64_t n, k;
};
// Qwen3-4B: hidden 2560, QKV 4096 + 2 x 1024, intermediate 9728 (gate_up 2 x 9728).
constexpr Proj kProjs[] = {
    {"qkv", 6144, 2560}, {"o", 2560, 4096}, {"gate_up", 19456, 2560}, {"down", 2560, 9728}};
constexpr int64_t kMs[] = {16, 32, 64, 1024, 4096, 8192};
constexpr int64_t kDecodeMaxM = 64;  // rows of M up to this: weight-byte GB/s, the split-K table

// cuBLASLt D[N, M] (column-major, = out [M, N] row-major) = alpha * (a_scale * W) (b_scale * X)^T with W, X
// e4m3, per-tensor scales on the device, bf16 D: the "TN" layout FP8 requires. Up to 8 of the heuristic's
// algos, the first that cuBLASLt accepts at run time is kept (the first alone was refused with
// CUBLAS_STATUS_NOT_SUPPORTED on the H100, 2026-12-06).
class LtFp8Gemm {
 public:
  LtFp8Gemm(cublasLtHandle_t lt, int64_t m, int64_t n, int64_t k, const float* a_scale, const float* b_scale,
            bool fast_accum, size_t workspace_bytes)
      : lt_(lt) {
    KILN_LT_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn)));
    KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                                 sizeof(a_scale)));
    KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                 sizeof(b_scale)));
    const int8_t fast = fast_accum ? 1 : 0;
    KILN_LT_CHECK(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    KILN_LT_CHECK(cublasLtMatrixLayoutCreate(&a_, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), k));
    KILN_LT_CHECK(cublasLtMatrixLayoutCreate(&b_, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), k));
    KILN_LT_CHECK(cublasLtMatrixLayoutCreate(&d_, CUDA_R_16BF, uint64_t(n), uint64_t(m), n));
    cublasLtMatmulPreference_t pref;
    KILN_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    KILN_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace_bytes, sizeof(workspace_bytes)));
    if (cublasLtMatmulAlgoGetHeuristic(lt_, desc_, a_, b_, d_, d_, pref, kAlgos, heur_, &found_) !=
        CUBLAS_STATUS_SUCCESS)
      found_ = 0;
    KILN_LT_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  }
  ~LtFp8Gemm() {
    cublasLtMatrixLayoutDestroy(a_);
    cublasLtMatrixLayoutDestroy(b_);
    cublasLtMatrixLayoutDestroy(d_);
    cublasLtMatmulDescDestroy(desc_);
  }
  LtFp8Gemm(const LtFp8Gemm&) = delete;
  LtFp8Gemm& operator=(const LtFp8Gemm&) = delete;
  int algos() const { return found_; }
  // One matmul with the kept algo; the first call tries the heuristic's algos in order and keeps the first
  // accepted. Returns cuBLASLt's status (the last refusal when none was accepted).
  cublasStatus_t run(const void* w, const void* x, void* out, void* ws, size_t ws_bytes, cudaStream_t s) {
    const float alpha = 1.0f, beta = 0.0f;
    const auto matmul = [&](int i) {
      return cublasLtMatmul(lt_, desc_, &alpha, w, a_, x, b_, &beta, out, d_, out, d_, &heur_[i].algo, ws,
                            ws_bytes, s);
    };
    if (chosen_ >= 0) return matmul(chosen_);
    cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
    for (int i = 0; i < found_; ++i)
      if ((st = matmul(i)) == CUBLAS_STATUS_SUCCESS) {
        chosen_ = i;
        break;
      }
    return st;
  }

 private:
  static constexpr int kAlgos = 8;
  cublasLtHandle_t lt_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulHeuristicResult_t heur_[kAlgos] = {};
  int found_ = 0, chosen_ = -1;
};

std::string config_name(const kc::Fp8GemmConfig& c) {
  return "n" + std::to_string(c.tile_n) + " s" + std::to_string(c.stages) +
         (c.persistent ? " persistent" : " grid") +
         (c.cluster > 1 ? " cluster" + std::to_string(c.cluster) : "") + (c.tma_store ? " tma-store" : "") +
         (c.split_k > 1 ? " split" + std::to_string(c.split_k) : "");
}

std::string tflops_text(double flops, double us) {
  char b[48];
  std::snprintf(b, sizeof(b), "%.0f TFLOP/s", flops / (us * 1e-6) / 1e12);
  return b;
}

void run_fp8_gemm(const Env& env, std::vector<Row>& rows) {
  const Device dev = Device::cuda();
  if (!kc::fp8_gemm_supported(128, 128, 128, 128, 128, 128)) {
    rows.push_back(Row{"fp8_gemm", "kiln", "-", 0, -1, 0, "not run: needs an sm_90 GPU with sm_90a code"});
    return;
  }
  kc::GemmEngine& eng = kc::gemm_engine();
  cublasLtHandle_t lt;
  KILN_LT_CHECK(cublasLtCreate(&lt));
  const size_t lt_ws_bytes = size_t(32) << 20;
  Buffer lt_ws(lt_ws_bytes, dev);
  // The two per-tensor scales (1.0), each on its own 16-byte boundary.
  const std::vector<float> ones(8, 1.0f);
  Buffer scales(32, dev);
  copy_bytes(scales.data(), dev, ones.data(), Device::cpu(), 32);
  const float* a_scale = static_cast<const float*>(scales.data());
  struct Summary {
    std::string shape;
    double ours = 0, ours_all = 0, lt_fp8 = 0, lt_fp8_fast = 0, lt_bf16 = 0, flops = 0;
    double producer_unfused = 0, producer_fused = 0;  // the producer + GEMM (down, gate_up at M >= 4096)
    std::string best;
    double unsplit = 0, split = 0, dequant_bf16 = 0, weight_bytes = 0;  // M <= kDecodeMaxM: µs
    std::string best_unsplit, best_split;
  };
  std::vector<Summary> table;
  for (const Proj& pj : kProjs) {
    const int64_t N = pj.n, K = pj.k, Mmax = kMs[std::size(kMs) - 1];
    bool any = false;
    for (const int64_t M : kMs)
      any = any || selected(std::string("4B ") + pj.name + " M=" + std::to_string(M));
    if (!any) continue;
    // bf16 x and W for the bf16 GEMM; e4m3 W (the values do not change the time).
    Buffer x(size_t(Mmax * K) * 2, dev), w16(size_t(N * K) * 2, dev), wq(size_t(N * K), dev),
        ws8(size_t((N + 127) / 128 * ((K + 127) / 128)) * 4, dev), out(size_t(Mmax * N) * 2, dev);
    kc::fill_random_bf16(x.data(), Mmax * K, 1, 1.0f, 0.0f, env.stream);
    kc::fill_random_bf16(w16.data(), N * K, 2, 0.05f, 0.0f, env.stream);
    {
      // e4m3 codes with the top exponent bit clear (|w| < 2: finite, never NaN), scales 2^-8.
      std::vector<uint8_t> h(size_t(N * K));
      uint32_t r = 12345;
      for (auto& b : h) b = uint8_t(((r = r * 1664525u + 1013904223u) >> 24) & 0xbf);
      copy_bytes(wq.data(), dev, h.data(), Device::cpu(), h.size());
      std::vector<float> s(ws8.bytes() / 4, 1.0f / 256);
      copy_bytes(ws8.data(), dev, s.data(), Device::cpu(), ws8.bytes());
    }
    // The workspace of every config at every M (a split's partials at the decode sizes), and the dequantize
    // path's bf16 weight.
    int64_t ws_bytes = kc::fp8_gemm_workspace_bytes(Mmax, K);
    for (const int64_t M : kMs)
      for (const kc::Fp8GemmConfig& cfg : kc::kFp8GemmConfigs)
        ws_bytes = std::max(ws_bytes, kc::fp8_gemm_workspace_bytes(M, N, K, cfg));
    Buffer ws(size_t(ws_bytes), dev), deq(size_t(N * K) * 2, dev);
    for (const int64_t M : kMs) {
      const std::string shape = std::string("4B ") + pj.name + " M=" + std::to_string(M) +
                                " N=" + std::to_string(N) + " K=" + std::to_string(K);
      if (!selected(shape)) continue;
      Summary sm{shape};
      sm.flops = 2.0 * double(M) * double(N) * double(K);
      const bool decode = M <= kDecodeMaxM;
      // The rows' bytes: at decode sizes the weight's alone (the GB/s of its stream), else all operands.
      const double fp8_bytes = decode ? double(N * K) : double(M * K + N * K) + double(M * N) * 2;
      const double bf16_bytes = decode ? double(N * K) * 2 : double(M * K + N * K + M * N) * 2;
      sm.weight_bytes = double(N * K);
      const int64_t wsb = ws_bytes;
      // A row timed, or (a launch refused: kiln::Error) kept with its reason and no time.
      const auto time_row = [&](Row r, const std::function<void(int)>& launch) {
        try {
          launch(0);  // eager first call: lazy module loading, plans
          KILN_CUDA_CHECK(cudaStreamSynchronize(env.stream));
          r.us = time_cold_us(env, launch);
          r.path = (r.path.empty() ? "" : r.path + ", ") + tflops_text(sm.flops, r.us);
        } catch (const Error& e) {
          r.us = 0;
          r.path = std::string("not run: ") + e.what();
        }
        rows.push_back(r);
        return r.us;
      };
      // The quantizer alone, then our GEMM on its output in every config.
      const double q_us =
          time_row(Row{"fp8_gemm", "quantize_act", shape, 0, -1, double(M * K) * 3, ""},
                   [&](int) { kc::fp8_quantize_act(x.data(), K, M, K, ws.data(), wsb, env.stream); });
      (void)q_us;
      kc::Fp8GemmConfig best{};
      for (const kc::Fp8GemmConfig& cfg : kc::kFp8GemmConfigs) {
        if (kc::fp8_gemm_split(cfg, M, K) != cfg.split_k) continue;  // clamped: another config's kernel
        const double us =
            time_row(Row{"fp8_gemm", "kiln " + config_name(cfg), shape, 0, -1, fp8_bytes,
                         decode ? "bytes: weight" : ""},
                     [&](int) {
                       kc::fp8_gemm_quantized(wq.data(), K, static_cast<const float*>(ws8.data()), out.data(),
                                              N, M, N, K, ws.data(), wsb, cfg, env.stream);
                     });
        if (us > 0 && (sm.ours == 0 || us < sm.ours)) sm.ours = us, best = cfg;
        double& b = cfg.split_k > 1 ? sm.split : sm.unsplit;
        if (us > 0 && (b == 0 || us < b))
          b = us, (cfg.split_k > 1 ? sm.best_split : sm.best_unsplit) = config_name(cfg);
      }
      sm.best = config_name(best);
      sm.ours_all = time_row(Row{"fp8_gemm", "kiln quantize+gemm", shape, 0, -1,
                                 fp8_bytes + double(M * K) * 2, config_name(best)},
                             [&](int) {
                               kc::fp8_gemm(x.data(), K, wq.data(), K, static_cast<const float*>(ws8.data()),
                                            out.data(), N, M, N, K, ws.data(), wsb, best, env.stream);
                             });
      // The input's producer with the GEMM: down's input is SiLU-and-multiply of gate_up [M, 2K], gate_up's
      // the residual add + RMSNorm of [M, K] (the residual rewritten each sample, as in the model).
      const bool down = std::string(pj.name) == "down", gate_up = std::string(pj.name) == "gate_up";
      if ((down || gate_up) && M >= 4096) {
        const float* wsc = static_cast<const float*>(ws8.data());
        Buffer in(size_t(M * K) * (down ? 4 : 2), dev), act(size_t(M * K) * 2, dev), nw(size_t(K) * 2, dev);
        kc::fill_random_bf16(in.data(), M * K * (down ? 2 : 1), 3, 1.0f, 0.0f, env.stream);
        kc::fill_random_bf16(nw.data(), K, 4, 0.5f, 1.0f, env.stream);
        // producer bytes: read the input (2 K or K, + the residual read and written), write act / normed.
        const double in_bytes = double(M * K) * (down ? 4 : 6) + double(M * K) * 2;
        sm.producer_unfused = time_row(
            Row{"fp8_gemm", down ? "kiln silu_mul, quantize+gemm" : "kiln add_rms_norm, quantize+gemm", shape,
                0, -1, fp8_bytes + in_bytes + double(M * K) * 2, config_name(best)},
            [&](int) {
              if (down) {
                kc::silu_mul(in.data(), 2 * K, act.data(), K, M, K, env.stream);
              } else {
                kc::rms_norm(x.data(), K, in.data(), K, nw.data(), act.data(), K, M, K, 1e-6f, true,
                             env.stream);
              }
              kc::fp8_gemm(act.data(), K, wq.data(), K, wsc, out.data(), N, M, N, K, ws.data(), wsb, best,
                           env.stream);
            });
        sm.producer_fused = time_row(
            Row{"fp8_gemm", down ? "kiln silu_mul+quantize, gemm" : "kiln add_rms_norm+quantize, gemm", shape,
                0, -1, fp8_bytes + in_bytes - double(M * K), config_name(best)},
            [&](int) {
              if (down) {
                kc::silu_mul_quantize_act(in.data(), 2 * K, M, K, ws.data(), wsb, env.stream);
              } else {
                kc::rms_norm_quantize_act(x.data(), K, in.data(), K, nw.data(), nullptr, 0, M, K, 1e-6f, true,
                                          ws.data(), wsb, env.stream);
              }
              kc::fp8_gemm_quantized(wq.data(), K, wsc, out.data(), N, M, N, K, ws.data(), wsb, best,
                                     env.stream);
            });
      }
      // cuBLASLt FP8, per-tensor scales (the quantized activations of our workspace as its B operand).
      for (const bool fast : {false, true}) {
        LtFp8Gemm g(lt, M, N, K, a_scale, a_scale + 4, fast, lt_ws_bytes);
        const std::string variant = fast ? "cublaslt fp8 fast-accum" : "cublaslt fp8";
        const auto run = [&] {
          return g.run(wq.data(), ws.data(), out.data(), lt_ws.data(), lt_ws_bytes, env.stream);
        };
        const cublasStatus_t st = run();  // picks the algo
        if (st != CUBLAS_STATUS_SUCCESS) {
          rows.push_back(Row{"fp8_gemm", variant, shape, 0, -1, fp8_bytes,
                             "not run: cublasLtMatmul status " + std::to_string(int(st)) + " with each of " +
                                 std::to_string(g.algos()) + " heuristic algos"});
          continue;
        }
        (fast ? sm.lt_fp8_fast : sm.lt_fp8) =
            time_row(Row{"fp8_gemm", variant, shape, 0, -1, fp8_bytes, "per-tensor scales"},
                     [&](int) { KILN_LT_CHECK(run()); });
      }
      sm.lt_bf16 = time_row(Row{"fp8_gemm", "cublaslt bf16", shape, 0, -1, bf16_bytes,
                                decode ? "bf16 weight, bytes: weight" : ""},
                            [&](int) {
                              eng.run(x.data(), K, w16.data(), K, out.data(), N, M, N, K, kc::GemmOut::bf16,
                                      env.stream);
                            });
      // The tuner's other candidate for an FP8 weight (gemm_tune.cpp): dequantize into a scratch, then the
      // bf16 dispatch.
      if (decode)
        sm.dequant_bf16 = time_row(
            Row{"fp8_gemm", "dequantize + cublaslt bf16", shape, 0, -1, fp8_bytes, "bytes: e4m3 weight"},
            [&](int) {
              kc::dequantize_fp8(wq.data(), K, static_cast<const float*>(ws8.data()), deq.data(), N, K,
                                 env.stream);
              eng.run(x.data(), K, deq.data(), K, out.data(), N, M, N, K, kc::GemmOut::bf16, env.stream);
            });
      table.push_back(sm);
    }
  }
  KILN_LT_CHECK(cublasLtDestroy(lt));
  std::printf("\nfp8_gemm TFLOP/s (2 M N K / median time, cold L2; %s)\n", env.device_name.c_str());
  std::printf(
      "| shape | kiln gemm | best config | kiln quantize+gemm | cuBLASLt fp8 | cuBLASLt fp8 fast | cuBLASLt "
      "bf16 |\n");
  std::printf("| --- | ---: | --- | ---: | ---: | ---: | ---: |\n");
  const auto tf = [](double flops, double us) { return us > 0 ? flops / (us * 1e-6) / 1e12 : 0.0; };
  for (const Summary& s : table)
    std::printf("| %s | %.0f | %s | %.0f | %.0f | %.0f | %.0f |\n", s.shape.c_str(), tf(s.flops, s.ours),
                s.best.c_str(), tf(s.flops, s.ours_all), tf(s.flops, s.lt_fp8), tf(s.flops, s.lt_fp8_fast),
                tf(s.flops, s.lt_bf16));
  std::printf("\nfp8_gemm with the input's producer, TFLOP/s of the GEMM's 2 M N K (cold L2; %s)\n",
              env.device_name.c_str());
  std::printf("| shape | unfused producer + fp8_gemm | fused producer + fp8_gemm_quantized |\n");
  std::printf("| --- | ---: | ---: |\n");
  for (const Summary& s : table)
    if (s.producer_fused > 0 || s.producer_unfused > 0)
      std::printf("| %s | %.0f | %.0f |\n", s.shape.c_str(), tf(s.flops, s.producer_unfused),
                  tf(s.flops, s.producer_fused));
  std::printf("\nfp8_gemm at decode sizes, µs (median, cold L2; GB/s = e4m3 weight bytes / time; %s)\n",
              env.device_name.c_str());
  std::printf(
      "| shape | best unsplit | config | best split-K | config | split GB/s | dequantize + cuBLASLt bf16 | "
      "cuBLASLt bf16 (bf16 weight) |\n");
  std::printf("| --- | ---: | --- | ---: | --- | ---: | ---: | ---: |\n");
  for (const Summary& s : table)
    if (s.split > 0 || s.dequant_bf16 > 0)
      std::printf("| %s | %.2f | %s | %.2f | %s | %.0f | %.2f | %.2f |\n", s.shape.c_str(), s.unsplit,
                  s.best_unsplit.c_str(), s.split, s.best_split.c_str(),
                  s.split > 0 ? s.weight_bytes / (s.split * 1e-6) / 1e9 : 0.0, s.dequant_bf16, s.lt_bf16);
  std::printf("\n");
}

}  // namespace

KILN_KERNEL_BENCH(
    "fp8_gemm",
    "W8A8 block-FP8 GEMM (Qwen3-4B projections, M 16 / 32 / 64 with split-K, 1024 / 4096 / 8192) vs "
    "cuBLASLt FP8 per-tensor and bf16",
    run_fp8_gemm);

}  // namespace kiln::bench
