// GemmEngine::tune: times every candidate tactic per shape (gemm.h: the contract and what is timed).
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "kiln/env.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/fp8_dequant.h"
#include "ops/cuda/gemm_impl.h"
#include "ops/cuda/gemv_w8a8.h"

namespace kiln::cuda {

using namespace gemm_detail;

void GemmEngine::tune(const std::vector<GemmShape>& shapes, bool verbose) {
  const char* w8a8_env = std::getenv("KILN_GEMV_W8A8");
  KILN_CHECK(!w8a8_env || !*w8a8_env || std::string(w8a8_env) == "0" || std::string(w8a8_env) == "1",
             "KILN_GEMV_W8A8 must be 0 or 1, got '", w8a8_env, "'");
  const bool w8a8_offered = !w8a8_env || std::string(w8a8_env) != "0";
  const char* x16_env = std::getenv("KILN_GEMV_E4M3X16");
  const std::string x16 = x16_env ? x16_env : "";
  KILN_CHECK(x16.empty() || x16 == "0" || x16 == "1" || x16 == "8",
             "KILN_GEMV_E4M3X16 must be 0, 1 or 8 (the 8-row form alone), got '", x16, "'");
  const bool x16_offered = x16 != "0";
  const int x16_only_rows = x16 == "8" ? 8 : 0;  // 8: the lighter form left out (its A/B)
  size_t x_bytes = 0, w_bytes = 0, o_bytes = 0, scale_bytes = 4;
  for (const auto& s : shapes) {
    x_bytes = std::max(x_bytes, size_t(s.m_bucket * s.k * 2));
    w_bytes = std::max(w_bytes, size_t(s.n * s.k * 2));
    if (s.weight == GemmWeight::fp8)
      scale_bytes = std::max(scale_bytes, size_t((s.n + 127) / 128 * ((s.k + 127) / 128) * 4));
    o_bytes = std::max(o_bytes, size_t(s.m_bucket * aligned_ld(s.n) * (s.out == GemmOut::f32 ? 4 : 2)));
  }
  // Room for weight copies that together exceed 3x the L2: calls rotate over them, so a weight that
  // would fit in the L2 is still read from HBM, as in a decode step (each layer's weights once).
  int l2 = 0;
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, impl_->device);
  w_bytes = std::max(w_bytes, size_t(std::max(l2, 0)) * 3);
  void *x = nullptr, *w = nullptr, *o = nullptr, *scales = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&scales, scale_bytes));
  // 0x3c3c3c3c: f32 0.0115 as every block scale (e4m3 0x3c is 1.5): the FP8 weights' values are finite.
  KILN_CUDA_CHECK(cudaMemset(scales, 0x3c, scale_bytes));
  KILN_CUDA_CHECK(cudaMalloc(&x, x_bytes));
  KILN_CUDA_CHECK(cudaMalloc(&w, w_bytes));
  KILN_CUDA_CHECK(cudaMalloc(&o, o_bytes));
  // The residual-norm timing's residual (rewritten by every call) and normed rows, [M, K] like x.
  void *norm_res = nullptr, *norm_out = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&norm_res, x_bytes));
  KILN_CUDA_CHECK(cudaMalloc(&norm_out, x_bytes));
  KILN_CUDA_CHECK(cudaMemset(norm_res, 0x3c, x_bytes));
  // 0x3c3c is bf16 0.0115: finite, non-zero operands so the timing is of real arithmetic.
  KILN_CUDA_CHECK(cudaMemset(x, 0x3c, x_bytes));
  KILN_CUDA_CHECK(cudaMemset(w, 0x3c, w_bytes));
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  KILN_CUDA_CHECK(cudaEventCreate(&e0));
  KILN_CUDA_CHECK(cudaEventCreate(&e1));
  // µs per call of f(it) over `iters` calls (it = 0, 1, ...), after a warm-up call f(warm).
  const auto time_calls = [&](int iters, int64_t warm, const std::function<void(int64_t)>& f) {
    f(warm);
    KILN_CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int it = 0; it < iters; ++it) f(it);
    KILN_CUDA_CHECK(cudaEventRecord(e1, stream));
    KILN_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1000.0f / float(iters);
  };
  // The W8A8 GEMM's configs timed for a shape: every unsplit one, and a split-K one where it splits as
  // named (M <= kFp8GemmSplitKMaxM, K blocks >= split_k) and its unsplit tiles at the bucket's M are fewer
  // than the SMs (elsewhere a split only adds the partials' traffic and the reduce launch; and its partials,
  // M x N x split f32, would be the largest workspace: gate_up at M = 512).
  int sms = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, impl_->device));
  // KILN_FP8_GEMM_SPLIT_K=0 keeps the split configs from the tuner (fp8_gemm.h: on by default).
  const bool split_k_offered = env_switch("KILN_FP8_GEMM_SPLIT_K", kFp8GemmSplitKTunedByDefault);
  const auto w8a8_configs = [&](const GemmShape& s) {
    std::vector<Fp8GemmConfig> v;
    if (s.out != GemmOut::bf16 || !fp8_gemm_supported(s.m_bucket, s.n, s.k, s.k, s.k, aligned_ld(s.n)))
      return v;
    for (const Fp8GemmConfig& c : kFp8GemmConfigs) {
      const int64_t tiles = (s.m_bucket + 127) / 128 * ((s.n + c.tile_n - 1) / c.tile_n);
      if (c.split_k == 1 ||
          (split_k_offered && fp8_gemm_split(c, s.m_bucket, s.k) == c.split_k && tiles < sms))
        v.push_back(c);
    }
    return v;
  };
  // The W8A8 GEMM's shapes (FP8 weights, M buckets past the GEMV's): its workspace (the quantized input and
  // the largest split's partials) and the scratch path's dequantized weight.
  size_t fp8_ws_bytes = 0, fp8_deq_bytes = 0;
  for (const auto& s : shapes)
    if (s.weight == GemmWeight::fp8 && s.m_bucket > kGemvMaxM) {
      fp8_ws_bytes = std::max(fp8_ws_bytes, size_t(fp8_gemm_workspace_bytes(s.m_bucket, s.k)));
      for (const Fp8GemmConfig& c : w8a8_configs(s))
        fp8_ws_bytes = std::max(fp8_ws_bytes, size_t(fp8_gemm_workspace_bytes(s.m_bucket, s.n, s.k, c)));
      fp8_deq_bytes = std::max(fp8_deq_bytes, size_t(s.n * s.k * 2));
    }
  void *fp8_ws = nullptr, *fp8_deq = nullptr;
  if (fp8_ws_bytes) KILN_CUDA_CHECK(cudaMalloc(&fp8_ws, fp8_ws_bytes));
  if (fp8_deq_bytes) KILN_CUDA_CHECK(cudaMalloc(&fp8_deq, fp8_deq_bytes));
  // An FP8 weight's shape past the GEMV's buckets: the W8A8 GEMM's configs against the scratch path
  // (dequantize, then cuBLASLt's heuristic choice); an "fp8gemm" tactic where one of them won, else none.
  const auto tune_w8a8 = [&](const GemmShape& s) {
    tactics_.erase(s);
    const int64_t ldo = aligned_ld(s.n);
    const std::vector<Fp8GemmConfig> f8 = w8a8_configs(s);
    if (f8.empty()) return;
    const size_t w_one = size_t(s.n * s.k);
    const int64_t copies = std::max<int64_t>(1, int64_t(w_bytes / w_one));
    const auto wq = [&](int64_t it) { return static_cast<const char*>(w) + size_t(it % copies) * w_one; };
    const double flops = 2.0 * double(s.m_bucket) * double(s.n) * double(s.k);
    const int iters = std::clamp(int(2000.0 / (flops / 600e12 * 1e6 + 3.0)), 3, 100);
    Plan p = make_descriptors(s.m_bucket, s.n, s.k, s.out, s.k, s.k, ldo);
    const auto h = impl_->heuristic(p, 1);
    float best = 1e30f;
    int best_i = -1;  // the scratch path
    if (!h.empty())
      best = time_calls(iters, copies - 1, [&](int64_t it) {
        dequantize_fp8(wq(it), s.k, static_cast<const float*>(scales), fp8_deq, s.n, s.k, stream);
        impl_->matmul(p, h[0].algo, x, fp8_deq, o, stream);
      });
    const float scratch_us = best;
    for (size_t i = 0; i < f8.size(); ++i) {
      const float us = time_calls(iters, copies - 1, [&](int64_t it) {
        fp8_gemm(x, s.k, wq(it), s.k, static_cast<const float*>(scales), o, ldo, s.m_bucket, s.n, s.k, fp8_ws,
                 int64_t(fp8_ws_bytes), f8[i], stream);
      });
      if (us < best) best = us, best_i = int(i);
    }
    destroy(p);
    if (best_i >= 0) {
      GemmTactic t;
      t.kind = GemmKind::fp8gemm;
      t.fp8gemm = f8[size_t(best_i)];
      t.us = best;
      t.describe = describe_fp8gemm(t.fp8gemm);
      tactics_[s] = t;
    }
    if (verbose)
      std::printf("tune M<=%-5" PRId64 " N %-6" PRId64 " K %-5" PRId64
                  " %-9s %9.2f us  %5.1f TFLOP/s  (%zu cands; dequantize + cuBLASLt %.2f us) %s\n",
                  s.m_bucket, s.n, s.k, shape_out_field(s).c_str(), double(best), flops / best * 1e-6,
                  f8.size() + 1, double(scratch_us),
                  best_i >= 0 ? describe_fp8gemm(f8[size_t(best_i)]).c_str() : "dequantize + bf16 GEMM");
  };
  for (const auto& s : shapes) {
    // K not a multiple of 8: neither cuBLASLt's bf16 kernels nor the GEMV take it; run() sends it to the
    // any-shape kernel, so there is nothing to choose.
    if (s.k % 8 != 0) continue;
    // An FP8 weight's shape: the GEMV's configs up to M bucket 8, the W8A8 GEMM's past it.
    const bool fp8 = s.weight == GemmWeight::fp8;
    if (fp8 && s.m_bucket > kGemvMaxM) {
      tune_w8a8(s);
      continue;
    }
    // At run()'s output stride for this N (the staging stride where N is not a multiple of 8).
    Plan p = make_descriptors(s.m_bucket, s.n, s.k, s.out, s.k, s.k, aligned_ld(s.n));
    const size_t w_one = size_t(s.n * s.k) * (fp8 ? 1 : 2);  // bytes of one weight copy
    const int64_t copies = std::max<int64_t>(1, int64_t(w_bytes / w_one));
    const auto* w0 = static_cast<const uint16_t*>(w);
    // Weight copy `it % copies` (rotated so that every call reads W from HBM).
    const auto weight_at = [&](int64_t it) {
      return GemvWeight{static_cast<const char*>(w) + size_t(it % copies) * w_one, s.k,
                        fp8 ? static_cast<const float*>(scales) : nullptr};
    };
    std::vector<cublasLtMatmulAlgo_t> cands;
    for (const auto& r : fp8 ? std::vector<cublasLtMatmulHeuristicResult_t>{} : impl_->heuristic(p, 24)) {
      cands.push_back(r.algo);
      // Split-K variants help when M is small and the N tiles do not fill the GPU.
      if (s.m_bucket > 256) continue;
      for (uint32_t split : {2u, 4u, 8u, 16u}) {
        if (s.k / split < 256) break;
        cublasLtMatmulAlgo_t a = r.algo;
        if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split,
                                                 sizeof(split)) != CUBLAS_STATUS_SUCCESS)
          break;
        const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                             sizeof(scheme));
        if (impl_->check(p, a)) cands.push_back(a);
      }
    }
    // kiln's GEMV, one pseudo-tactic per block size, for the decode buckets.
    std::vector<GemvConfig> gemv_cands;
    // The multi-tile configs from M = 2: at M = 1 the one-tile ones keep the fused forms (gemv_fusable).
    if (gemv_supported(s.m_bucket, s.n, s.k, s.k, s.k, s.n, gemv_epilogue(s.out)))
      for (const GemvConfig& c : kGemvConfigs)
        if (s.m_bucket >= 2 || gemv_fusable(c)) gemv_cands.push_back(c);
    // An FP8 weight: the W8A8 GEMV's configs beside the W8A16 ones (gemv_w8a8.h), every bucket <= 8
    // (KILN_GEMV_W8A8=0: not offered, for A/B tactic caches).
    if (fp8 && w8a8_offered && gemv_w8a8_supported(s.m_bucket, s.n, s.k, s.k, s.k, s.n, gemv_epilogue(s.out)))
      for (const GemvConfig& c : kGemvW8a8Configs) gemv_cands.push_back(c);
    // An FP8 weight: the e4m3 x 16 configs, both forms (gemv.h; one-tile FMA, so fusable: every fused form
    // runs them), where K is a multiple of 16, unless KILN_GEMV_E4M3X16=0 (8: the 8-row form alone).
    if (fp8 && x16_offered && gemv_supported(s.m_bucket, s.n, s.k, s.k, s.k, s.n, gemv_epilogue(s.out)) &&
        s.k % 16 == 0)
      for (const GemvConfig& c : kGemvE4m3x16Configs)
        if (!x16_only_rows || c.x16_rows == x16_only_rows) gemv_cands.push_back(c);
    if (cands.empty() && gemv_cands.empty()) {  // nothing to time: run() takes the any-shape kernel
      destroy(p);
      continue;
    }
    // Enough repetitions for ~2 ms of work per candidate, at least 3.
    const double flops = 2.0 * double(s.m_bucket) * double(s.n) * double(s.k);
    const double bytes = double(w_one) + 2.0 * double(s.m_bucket * s.k + s.m_bucket * s.n);
    const double est_us = std::max(flops / 600e12, bytes / 3.5e12) * 1e6 + 3.0;
    const int iters = std::clamp(int(2000.0 / est_us), 3, 200);
    // Candidate i < cands.size() is cuBLASLt's, the rest are GEMV configurations.
    auto call = [&](size_t i, int64_t it) {
      const GemvWeight wi = weight_at(it);
      if (i < cands.size())
        impl_->matmul(p, cands[i], x, wi.data, o, stream);  // o rows at aligned_ld(N)
      else
        gemv(x, s.k, wi, o, s.n, s.m_bucket, s.n, s.k, gemv_epilogue(s.out), gemv_cands[i - cands.size()],
             stream, /*pdl=*/true);
    };
    // µs per call of f(it) over `iters` calls rotating the weight copies, after a warm-up call.
    const auto time_us = [&](const std::function<void(int64_t)>& f) {
      return time_calls(iters, copies - 1, f);
    };
    float best = 1e30f, best_fusable = 1e30f;
    size_t best_i = 0, best_fusable_i = 0;  // best_fusable_i: the fastest one-tile W8A16 GEMV, if any
    for (size_t i = 0; i < cands.size() + gemv_cands.size(); ++i) {
      if (i < cands.size() && !impl_->check(p, cands[i])) continue;
      const float us = time_us([&](int64_t it) { call(i, it); });
      if (us < best) best = us, best_i = i;
      if (i >= cands.size() && gemv_fusable(gemv_cands[i - cands.size()]) && us < best_fusable)
        best_fusable = us, best_fusable_i = i;
    }
    GemmTactic t;
    if (best_i < cands.size()) {
      std::memcpy(t.algo, &cands[best_i], sizeof(t.algo));
      t.describe = describe_algo(cands[best_i]);
    } else {
      t.kind = GemmKind::gemv;
      t.gemv = gemv_cands[best_i - cands.size()];
      t.describe = describe_gemv(t.gemv);
      // The residual-norm prologue against the add_rms_norm kernel then this GEMV (x, o and the first rows
      // of w standing in for delta, residual and the norm weight: the timing does not depend on the values).
      // A W8A8 winner: its own prologue (gemv_w8a8_norm_in) and the fastest one-tile W8A16 config's, each
      // against the add_rms_norm kernel then the W8A8 GEMV; the tactic keeps the faster prologue
      // (norm_in_gemv names a W8A16 one) for the calls whose input is a residual add + RMSNorm
      // (gemv_norm_in_choice); the other calls run the W8A8 GEMV.
      const bool w8a8 = t.gemv.w8a8 != 0;
      const bool w8a8_alt = w8a8 && best_fusable_i >= cands.size();
      const GemvConfig alt_cfg = w8a8_alt ? gemv_cands[best_fusable_i - cands.size()] : t.gemv;
      const bool prologue_ok =
          w8a8 ? gemv_w8a8_norm_in_supported(s.m_bucket, s.n, s.k, s.k, s.k, s.k, s.n, GemvEpilogue::bf16)
               : gemv_norm_in_fusable(t.gemv) && (gemv_norm_in_tiles_ || t.gemv.tiles == 1) &&
                     gemv_norm_in_supported(s.m_bucket, s.n, s.k, s.k, s.k, s.k, s.n, GemvEpilogue::bf16);
      if (s.out == GemmOut::bf16 && prologue_ok) {
        const float pair = time_us([&](int64_t it) {
          rms_norm(x, s.k, norm_res, s.k, w0, norm_out, s.k, s.m_bucket, s.k, 1e-6f, /*add=*/true, stream,
                   /*pdl=*/true);
          gemv(norm_out, s.k, weight_at(it), o, s.n, s.m_bucket, s.n, s.k, GemvEpilogue::bf16, t.gemv, stream,
               /*pdl=*/true);
        });
        const auto fused_us = [&](GemvConfig c) {
          return time_us([&](int64_t it) {
            ::kiln::cuda::gemv_norm_in(x, s.k, norm_res, s.k, w0, 1e-6f, weight_at(it), o, s.n, s.m_bucket,
                                       s.n, s.k, GemvEpilogue::bf16, c, stream, /*pdl=*/true);
          });
        };
        float fused = fused_us(t.gemv);
        GemvConfig fused_cfg = t.gemv;
        if (w8a8_alt &&
            gemv_norm_in_supported(s.m_bucket, s.n, s.k, s.k, s.k, s.k, s.n, GemvEpilogue::bf16)) {
          const float alt = fused_us(alt_cfg);
          if (alt < fused) fused = alt, fused_cfg = alt_cfg;
        }
        t.gemv_norm_in = fused < pair;
        if (t.gemv_norm_in && !(fused_cfg == t.gemv)) {
          t.norm_in_gemv = fused_cfg;
          t.describe += " +norm-in " + describe_gemv(fused_cfg);
        } else if (t.gemv_norm_in) {
          t.describe += " +norm-in";
        }
      }
    }
    t.us = best;
    if (verbose)
      std::printf("tune M<=%-5" PRId64 " N %-6" PRId64 " K %-5" PRId64
                  " %-9s %9.2f us  %5.1f TFLOP/s  %6.0f GB/s  (%zu cands) %s\n",
                  s.m_bucket, s.n, s.k, shape_out_field(s).c_str(), double(best), flops / best * 1e-6,
                  bytes / best * 1e-3, cands.size() + gemv_cands.size(), t.describe.c_str());
    tactics_[s] = t;
    destroy(p);
  }
  // Plans made before tuning keep their algorithm only if it is still the tuned one: rebuild them lazily.
  for (auto& [key, plan] : impl_->plans) destroy(plan);
  impl_->plans.clear();
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
  cudaFree(x);
  cudaFree(w);
  cudaFree(o);
  cudaFree(norm_res);
  cudaFree(norm_out);
  cudaFree(scales);
  if (fp8_ws) cudaFree(fp8_ws);
  if (fp8_deq) cudaFree(fp8_deq);
}

}  // namespace kiln::cuda
