// Helpers for the GPU tests: device buffers from host vectors, deterministic random bf16 data, ulp
// distance, the fp64 reference of the W8A8 (path (a)) products and the per-row error against it, the
// residual-norm prologue's check, a graph's replays against eager runs (the whole-model tests add
// common/model_steps.h). Every test skips (and says
// so) when no GPU is visible.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/test_support.h"
#include "kiln/cuda_check.h"
#include "kiln/dtype.h"
#include "kiln/tensor.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gemv.h"
#include "ops/fp8.h"
#include "ops/fp8_linear.h"

#define KILN_REQUIRE_GPU()                                                       \
  do {                                                                           \
    if (!kiln::cuda_available()) GTEST_SKIP() << "no CUDA GPU visible: skipped"; \
  } while (0)

namespace kiln::test {

// ||a - b|| / ||b|| over bf16 vectors of one size (Frobenius; b is the reference).
inline double rel_frob(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

template <typename T>
Buffer to_device(const std::vector<T>& v) {
  Buffer b(v.size() * sizeof(T), Device::cuda());
  copy_bytes(b.data(), Device::cuda(), v.data(), Device::cpu(), v.size() * sizeof(T));
  return b;
}

template <typename T>
std::vector<T> to_host(const Buffer& b, size_t n) {
  std::vector<T> v(n);
  copy_bytes(v.data(), Device::cpu(), b.data(), Device::cuda(), n * sizeof(T));
  return v;
}

// Sets every byte of a device buffer to 0xff (bf16 and f32 NaN), so an element a kernel never writes fails
// any value check. Ordered before later work on the legacy default stream, like any cudaMemset.
inline void poison(const Buffer& b) {
  KILN_CUDA_CHECK(cudaMemset(b.data(), 0xff, b.bytes()));
}

inline std::vector<bf16_t> random_bf16(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return test_support::random_bf16(n, seed, lo, hi);  // the GPU tests' default range
}

// Distance in bf16 ulps between two finite bf16 values (via the order-preserving integer map).
inline int bf16_ulps(bf16_t a, bf16_t b) {
  auto key = [](uint16_t u) { return (u & 0x8000u) ? -int(u & 0x7fffu) : int(u); };
  return std::abs(key(a.bits) - key(b.bits));
}

// out poisoned, then cuda::gemv with config cfg (default stream, no PDL); out's bytes (all of them).
inline std::vector<uint8_t> run_gemv(const Buffer& x, int64_t ldx, const cuda::GemvWeight& w,
                                     const Buffer& out, int64_t ldo, int64_t m, int64_t n, int64_t k,
                                     cuda::GemvEpilogue epi, cuda::GemvConfig cfg) {
  poison(out);
  cuda::gemv(x.data(), ldx, w, out.data(), ldo, m, n, k, epi, cfg, nullptr);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return to_host<uint8_t>(out, out.bytes());
}

// The CPU activation quantizer (ops::quantize_act_fp8, the oracle) on rows `rows` of x [*, ldx] (the first K
// columns): codes [rows.size(), K] and scales [rows.size(), ceil(K/128)].
struct QuantRows {
  std::vector<uint8_t> q;
  std::vector<float> s;
};
inline QuantRows quantize_rows(const std::vector<bf16_t>& x, int64_t ldx, int64_t K,
                               const std::vector<int64_t>& rows) {
  const int64_t R = int64_t(rows.size()), Kb = ops::fp8_blocks(K);
  std::vector<bf16_t> xr(size_t(R * K));
  for (int64_t i = 0; i < R; ++i)
    std::memcpy(&xr[size_t(i * K)], &x[size_t(rows[size_t(i)] * ldx)], size_t(K) * 2);
  QuantRows out{std::vector<uint8_t>(size_t(R * K)), std::vector<float>(size_t(R * Kb))};
  ops::quantize_act_fp8(Tensor(xr.data(), DType::bf16, {R, K}), Tensor(out.q.data(), DType::f8e4m3, {R, K}),
                        Tensor(out.s.data(), DType::f32, {R, Kb}));
  return out;
}

// The fp64 product of path (a)'s operands for the quantized rows a: ref[i * N + n] = sum over K blocks kb of
// (sum_k f32(xq[i, k]) f32(wq[n, k])) * a_s[i, kb] * w_s[n / 128, kb]. wq: e4m3 [N, ldw]; ws: f32
// [ceil(N/128), ceil(K/128)]. Rows of W split over up to 16 threads (the large GEMM shapes).
inline std::vector<double> w8a8_reference(const QuantRows& a, const uint8_t* wq, int64_t ldw, const float* ws,
                                          int64_t N, int64_t K) {
  const int64_t Kb = ops::fp8_blocks(K), R = int64_t(a.s.size()) / Kb;
  std::vector<double> af(size_t(R * K));
  for (size_t i = 0; i < af.size(); ++i) af[i] = double(e4m3_to_f32(a.q[i]));
  std::vector<double> ref(size_t(R * N));
  const unsigned nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < nt; ++t)
    pool.emplace_back([&, t] {
      std::vector<double> wf(static_cast<size_t>(K));
      for (int64_t n = t; n < N; n += nt) {
        for (int64_t k = 0; k < K; ++k) wf[size_t(k)] = double(e4m3_to_f32(wq[size_t(n * ldw + k)]));
        for (int64_t i = 0; i < R; ++i) {
          double acc = 0;
          for (int64_t kb = 0; kb < Kb; ++kb) {
            double p = 0;
            for (int64_t k = kb * 128; k < std::min(K, kb * 128 + 128); ++k)
              p += af[size_t(i * K + k)] * wf[size_t(k)];
            acc += p * double(a.s[size_t(i * Kb + kb)]) * double(ws[size_t((n / 128) * Kb + kb)]);
          }
          ref[size_t(i * N + n)] = acc;
        }
      }
    });
  for (auto& th : pool) th.join();
  return ref;
}

// The largest relative Frobenius error of a row i < rows of got(i, n) against ref[i * N + n] (NaN wins; a
// zero row compares by its absolute error); worst_row: that row's index i.
inline double worst_row_error(const std::vector<double>& ref,
                              const std::function<double(int64_t, int64_t)>& got, int64_t rows, int64_t N,
                              int64_t* worst_row = nullptr) {
  double worst = 0;
  for (int64_t i = 0; i < rows; ++i) {
    double num = 0, den = 0;
    for (int64_t n = 0; n < N; ++n) {
      const double r = ref[size_t(i * N + n)], d = got(i, n) - r;
      num += d * d;
      den += r * r;
    }
    const double e = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    if (!(e <= worst)) {
      worst = e;
      if (worst_row) *worst_row = i;
    }
  }
  return worst;
}

// The residual-norm prologue's bitwise check: cuda::gemv_norm_in with config cfg (groups_per_block groups),
// then the rms_norm kernel (add) into normed followed by cuda::gemv with cfg on the normed rows; returns
// {out, residual} of each run, every byte. delta and res0 (the residual before the call): bf16 [m, ld];
// res: the residual both runs rewrite; nw: the norm weight [k]; out: [m, cols] (cols: the output columns,
// N / 2 for silu_mul) poisoned before each run; normed: bf16 [m, k] scratch.
struct NormInRuns {
  std::vector<std::vector<uint8_t>> fused, unfused;
};
inline NormInRuns norm_in_runs(const Buffer& delta, const Buffer& res0, const Buffer& res, int64_t ld,
                               const Buffer& nw, float eps, const cuda::GemvWeight& w, const Buffer& out,
                               int64_t cols, const Buffer& normed, int64_t m, int64_t n, int64_t k,
                               cuda::GemvEpilogue epi, cuda::GemvConfig cfg, int groups_per_block = 0) {
  const auto reset = [&] {
    poison(out);
    KILN_CUDA_CHECK(cudaMemcpy(res.data(), res0.data(), res0.bytes(), cudaMemcpyDeviceToDevice));
  };
  const auto results = [&] {
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    return std::vector<std::vector<uint8_t>>{to_host<uint8_t>(out, out.bytes()),
                                             to_host<uint8_t>(res, res0.bytes())};
  };
  NormInRuns r;
  reset();
  cuda::gemv_norm_in(delta.data(), ld, res.data(), ld, nw.data(), eps, w, out.data(), cols, m, n, k, epi, cfg,
                     nullptr, false, groups_per_block);
  r.fused = results();
  reset();
  poison(normed);
  cuda::rms_norm(delta.data(), ld, res.data(), ld, nw.data(), normed.data(), k, m, k, eps, /*add=*/true,
                 nullptr);
  cuda::gemv(normed.data(), k, w, out.data(), cols, m, n, k, epi, cfg, nullptr);
  r.unfused = results();
  return r;
}

// Captures capture(stream) once into a CUDA graph (on a stream of its own), then for each round r < rounds:
// load(r) (fresh inputs copied into the captured buffers, outputs poisoned, synchronized), eager(stream),
// outputs(); load(r) again, the graph replayed, outputs(). Returns "" where every replay equals its eager
// run, else the first round that differs.
inline std::string graph_replay_mismatch(const std::function<void(cudaStream_t)>& capture,
                                         const std::function<void(cudaStream_t)>& eager,
                                         const std::function<void(uint32_t)>& load,
                                         const std::function<std::vector<std::vector<uint8_t>>()>& outputs,
                                         uint32_t rounds = 4) {
  cudaStream_t st;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  capture(st);
  KILN_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  cudaGraphExec_t exec;
  KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::string mismatch;
  for (uint32_t r = 0; r < rounds && mismatch.empty(); ++r) {
    load(r);
    eager(st);
    KILN_CUDA_CHECK(cudaStreamSynchronize(st));
    const auto want = outputs();
    load(r);
    KILN_CUDA_CHECK(cudaGraphLaunch(exec, st));
    KILN_CUDA_CHECK(cudaStreamSynchronize(st));
    if (outputs() != want) mismatch = "replay " + std::to_string(r) + " differs from its eager run";
  }
  KILN_CUDA_CHECK(cudaGraphExecDestroy(exec));
  KILN_CUDA_CHECK(cudaGraphDestroy(graph));
  KILN_CUDA_CHECK(cudaStreamDestroy(st));
  return mismatch;
}

}  // namespace kiln::test
