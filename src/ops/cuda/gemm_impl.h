// GemmEngine's internals shared by gemm.cpp (dispatch, tactic cache) and gemm_tune.cpp (the tuner): the
// cuBLASLt plans, the naming helpers and GemmEngine::Impl. Not for use outside those two files.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/cuda_check.h"
#include "kiln/error.h"
#include "ops/cuda/gemm.h"

#define KILN_LT_CHECK(expr)                                                               \
  do {                                                                                    \
    cublasStatus_t kiln_s_ = (expr);                                                      \
    KILN_CHECK(kiln_s_ == CUBLAS_STATUS_SUCCESS, #expr ": cublas status ", int(kiln_s_)); \
  } while (0)

namespace kiln::cuda {
namespace gemm_detail {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr int64_t kMaxBucket = 16384;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool have_algo = false;
};

inline void destroy(Plan& p) {
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.d) cublasLtMatrixLayoutDestroy(p.d);
  p = Plan{};
}

// Row-major out[M,N] = x[M,K] W[N,K]^T is column-major out^T[N,M] = W^T' (op T on the K x N column-major
// view of W) times x^T (the K x M column-major view of x).
inline Plan make_descriptors(int64_t m, int64_t n, int64_t k, GemmOut out, int64_t ldx, int64_t ldw,
                             int64_t ldo) {
  Plan p;
  KILN_LT_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  KILN_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, uint64_t(k), uint64_t(n), ldw));
  KILN_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, uint64_t(k), uint64_t(m), ldx));
  KILN_LT_CHECK(cublasLtMatrixLayoutCreate(&p.d, out == GemmOut::f32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(n),
                                           uint64_t(m), ldo));
  return p;
}

inline std::string describe_algo(const cublasLtMatmulAlgo_t& algo) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
    uint32_t v = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS)
      return -1L;
    return long(v);
  };
  std::ostringstream os;
  os << "algo " << get(CUBLASLT_ALGO_CONFIG_ID) << " tile " << get(CUBLASLT_ALGO_CONFIG_TILE_ID) << " stages "
     << get(CUBLASLT_ALGO_CONFIG_STAGES_ID) << " splitK " << get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)
     << " reduction " << get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) << " swizzle "
     << get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING) << " custom " << get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION);
  return os.str();
}

inline const char* out_name(GemmOut o) {
  return o == GemmOut::f32 ? "f32" : "bf16";
}

inline GemvEpilogue gemv_epilogue(GemmOut o) {
  return o == GemmOut::f32 ? GemvEpilogue::f32 : GemvEpilogue::bf16;
}

inline std::string describe_gemv(GemvConfig c) {
  return std::string(c.w8a8           ? "kiln-gemv-w8a8"
                     : c.tensor_cores ? "kiln-gemv-tc"
                     : c.e4m3x16      ? "kiln-gemv-e4m3x16"
                                      : "kiln-gemv") +
         " warps " + std::to_string(c.warps) + " rows " + std::to_string(gemv_rows(c)) +
         (c.w8a8 ? " kblocks " + std::to_string(c.w8a8) : "");
}

inline std::string describe_fp8gemm(const Fp8GemmConfig& c) {
  return "kiln-fp8gemm tile_n " + std::to_string(c.tile_n) + " stages " + std::to_string(c.stages) +
         (c.persistent ? " persistent" : "") + " cluster " + std::to_string(c.cluster) +
         (c.tma_store ? " tma-store" : "") + (c.split_k > 1 ? " split_k " + std::to_string(c.split_k) : "");
}

// The cache line's out field: the output type, and ":e4m3" for a block-FP8 weight.
inline std::string shape_out_field(const GemmShape& s) {
  return std::string(out_name(s.out)) + (s.weight == GemmWeight::fp8 ? ":e4m3" : "");
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// cuBLASLt's output row stride for N columns: N rounded up to 16 bytes of bf16 (what its tensor-op kernels
// need). The tuner times every shape at this stride, and run() stages an unaligned output through it.
inline int64_t aligned_ld(int64_t n) {
  return (n + 7) / 8 * 8;
}

}  // namespace gemm_detail

struct GemmEngine::Impl {
  int device = 0;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  std::string gpu_name;
  // (M, N, K, out, ldx, ldw, ldo, the M bucket whose tactic the plan runs, the plain step's M of a verify
  // call whose untuned shape takes that M's heuristic algorithm, else 0)
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int64_t, int64_t, int64_t, int64_t, int64_t>,
           gemm_detail::Plan>
      plans;
  // Grow-only device buffers: outgrown ones are kept (in `retired`), since a captured CUDA graph may still
  // use them, and none grows while its stream captures a graph (no allocation may happen there).
  struct GrowOnly {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  std::vector<void*> retired;
  // `want` bytes of b (grown to max(want, grow_to) when short), or null where it is short while `stream`
  // (null: none) captures a graph.
  void* grow(GrowOnly& b, size_t want, size_t grow_to, cudaStream_t stream) {
    if (want <= b.bytes) return b.ptr;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (stream) KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &cs));
    if (cs != cudaStreamCaptureStatusNone) return nullptr;
    void* grown = nullptr;
    const size_t n = std::max(want, grow_to);
    KILN_CUDA_CHECK(cudaMalloc(&grown, n));
    if (b.ptr) retired.push_back(b.ptr);
    b = {grown, n};
    return grown;
  }
  // Aligned output rows for a GEMM whose own output cuBLASLt cannot write (run()); CudaDecodeGraph runs each
  // step eagerly first, which grows it.
  GrowOnly staging;
  void* staging_for(size_t bytes, cudaStream_t stream) {
    return grow(staging, bytes, 2 * staging.bytes, stream);
  }
  // The FP8 dequantization scratch (run() with an FP8 weight): short inside a capture is an error.
  GrowOnly fp8_scratch;
  void* fp8_scratch_for(size_t bytes, cudaStream_t stream) {
    void* p = grow(fp8_scratch, bytes, 0, stream);
    KILN_CHECK(p, "GemmEngine: the FP8 dequantization scratch (", fp8_scratch.bytes,
               " bytes) is smaller than a weight of ", bytes,
               " bytes inside a CUDA graph capture, where it cannot grow: reserve_fp8_dequant first");
    return p;
  }
  // The W8A8 GEMM's workspace (fp8_gemm.h): null where short inside a capture (run() then takes the scratch
  // path).
  GrowOnly fp8_ws;

  // Heuristic candidates for a plan's descriptors (at most `count`).
  std::vector<cublasLtMatmulHeuristicResult_t> heuristic(const gemm_detail::Plan& p, int count) const {
    cublasLtMatmulPreference_t pref = nullptr;
    KILN_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = gemm_detail::kWorkspaceBytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    std::vector<cublasLtMatmulHeuristicResult_t> res(static_cast<size_t>(count));
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.d, p.d, pref, count, res.data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS) found = 0;
    res.resize(size_t(found));
    std::erase_if(res, [](const auto& r) { return r.state != CUBLAS_STATUS_SUCCESS; });
    return res;
  }

  bool check(const gemm_detail::Plan& p, const cublasLtMatmulAlgo_t& algo) const {
    cublasLtMatmulHeuristicResult_t r{};
    if (cublasLtMatmulAlgoCheck(lt, p.op, p.a, p.b, p.d, p.d, &algo, &r) != CUBLAS_STATUS_SUCCESS)
      return false;
    return r.workspaceSize <= gemm_detail::kWorkspaceBytes;
  }

  void matmul(const gemm_detail::Plan& p, const cublasLtMatmulAlgo_t& algo, const void* x, const void* w,
              void* out, cudaStream_t stream) const {
    const float alpha = 1.0f, beta = 0.0f;
    KILN_LT_CHECK(cublasLtMatmul(lt, p.op, &alpha, w, p.a, x, p.b, &beta, out, p.d, out, p.d, &algo,
                                 workspace, gemm_detail::kWorkspaceBytes, stream));
  }
};

}  // namespace kiln::cuda
