// cuBLASLt GEMM with the tactic cache: plans (descriptors + chosen algo) per exact (M, N, K, out),
// tactics per (M bucket, N, K, out). See gemm.h for the contract.
#include "ops/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "kiln/cuda_check.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "kiln/atomic_file.h"
#include "kiln/error.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/fp8_dequant.h"
#include "ops/cuda/gemm_any.h"

#define KILN_LT_CHECK(expr)                                                               \
  do {                                                                                    \
    cublasStatus_t kiln_s_ = (expr);                                                      \
    KILN_CHECK(kiln_s_ == CUBLAS_STATUS_SUCCESS, #expr ": cublas status ", int(kiln_s_)); \
  } while (0)

namespace kiln::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr int64_t kMaxBucket = 16384;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool have_algo = false;
};

void destroy(Plan& p) {
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.d) cublasLtMatrixLayoutDestroy(p.d);
  p = Plan{};
}

// Row-major out[M,N] = x[M,K] W[N,K]^T is column-major out^T[N,M] = W^T' (op T on the K x N column-major
// view of W) times x^T (the K x M column-major view of x).
Plan make_descriptors(int64_t m, int64_t n, int64_t k, GemmOut out, int64_t ldx, int64_t ldw, int64_t ldo) {
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

std::string describe_algo(const cublasLtMatmulAlgo_t& algo) {
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

const char* out_name(GemmOut o) {
  return o == GemmOut::f32 ? "f32" : "bf16";
}

GemvEpilogue gemv_epilogue(GemmOut o) {
  return o == GemmOut::f32 ? GemvEpilogue::f32 : GemvEpilogue::bf16;
}

std::string describe_gemv(GemvConfig c) {
  return std::string(c.tensor_cores ? "kiln-gemv-tc" : "kiln-gemv") + " warps " + std::to_string(c.warps) +
         " rows " + std::to_string(gemv_rows(c));
}

std::string describe_fp8gemm(const Fp8GemmConfig& c) {
  return "kiln-fp8gemm tile_n " + std::to_string(c.tile_n) + " stages " + std::to_string(c.stages) +
         (c.persistent ? " persistent" : "") + " cluster " + std::to_string(c.cluster) +
         (c.tma_store ? " tma-store" : "");
}

constexpr const char* kCacheFormat = "kiln-gemm-tactics v3";
constexpr const char* kCacheFormatV2 = "kiln-gemm-tactics v2";  // bf16 weights only: read as such

// The cache line's out field: the output type, and ":e4m3" for a block-FP8 weight.
std::string shape_out_field(const GemmShape& s) {
  return std::string(out_name(s.out)) + (s.weight == GemmWeight::fp8 ? ":e4m3" : "");
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// cuBLASLt's output row stride for N columns: N rounded up to 16 bytes of bf16 (what its tensor-op kernels
// need). The tuner times every shape at this stride, and run() stages an unaligned output through it.
int64_t aligned_ld(int64_t n) {
  return (n + 7) / 8 * 8;
}

// An on/off switch from the environment: "0" or "1", else `fallback` when unset or empty.
bool env_switch(const char* name, bool fallback) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  KILN_CHECK(std::string(e) == "0" || std::string(e) == "1", name, " must be 0 or 1, got '", e, "'");
  return std::string(e) == "1";
}

}  // namespace

std::string format_tactic_line(const GemmShape& s, const GemmTactic& t) {
  std::ostringstream out;
  out << s.m_bucket << ' ' << s.n << ' ' << s.k << ' ' << shape_out_field(s) << ' ' << t.us << ' '
      << (t.kind == GemmKind::gemv      ? "gemv"
          : t.kind == GemmKind::fp8gemm ? "fp8gemm"
                                        : "lt")
      << std::hex;
  for (int i = 0; i < 8; ++i) {
    const uint64_t gemv_word = i == 0   ? uint64_t(t.gemv.warps)
                               : i == 1 ? uint64_t(t.gemv.tensor_cores)
                               : i == 2 ? uint64_t(t.gemv_norm_in)
                               : i == 3 ? uint64_t(t.gemv.tiles == 1 ? 0 : t.gemv.tiles)
                                        : 0;
    const Fp8GemmConfig& f = t.fp8gemm;
    const uint64_t fp8_word = i == 0   ? uint64_t(f.tile_n)
                              : i == 1 ? uint64_t(f.stages)
                              : i == 2 ? uint64_t(f.persistent)
                              : i == 3 ? uint64_t(f.cluster)
                              : i == 4 ? uint64_t(f.tma_store)
                                       : 0;
    const uint64_t word = t.kind == GemmKind::gemv      ? gemv_word
                          : t.kind == GemmKind::fp8gemm ? fp8_word
                                                        : t.algo[i];
    out << ' ' << word;
  }
  out << std::dec << " # " << t.describe;
  return out.str();
}

bool parse_tactic_line(const std::string& line, GemmShape& s, GemmTactic& t) {
  std::istringstream is(line);
  std::string out, kind;
  s = GemmShape{};
  t = GemmTactic{};
  is >> s.m_bucket >> s.n >> s.k >> out >> t.us >> kind;
  for (auto& word : t.algo) is >> std::hex >> word;
  if (out.ends_with(":e4m3")) {
    s.weight = GemmWeight::fp8;
    out.resize(out.size() - 5);
  }
  if (!is || (out != "bf16" && out != "f32") || (kind != "lt" && kind != "gemv" && kind != "fp8gemm"))
    return false;
  // An FP8 weight's tactic is the FP8 GEMV or the W8A8 GEMM (run() dequantizes for everything else); the
  // W8A8 GEMM is an FP8 weight's only.
  if ((kind == "lt" && s.weight == GemmWeight::fp8) || (kind == "fp8gemm" && s.weight != GemmWeight::fp8))
    return false;
  s.out = out == "f32" ? GemmOut::f32 : GemmOut::bf16;
  if (kind == "fp8gemm") {
    t.kind = GemmKind::fp8gemm;
    t.fp8gemm = Fp8GemmConfig{int(t.algo[0] & 0xffff), int(t.algo[1] & 0xffff), t.algo[2] == 1,
                              int(t.algo[3] & 0xffff), t.algo[4] == 1};
    bool ok = t.algo[2] <= 1 && t.algo[4] <= 1 && s.out == GemmOut::bf16 && s.m_bucket >= 1;
    for (int i = 5; i < 8; ++i) ok = ok && t.algo[i] == 0;
    for (int i = 0; i < 4; ++i) ok = ok && t.algo[i] <= 0xffff;
    bool known = false;
    for (const Fp8GemmConfig& c : kFp8GemmConfigs) known = known || c == t.fp8gemm;
    if (!ok || !known) return false;
    std::fill(std::begin(t.algo), std::end(t.algo), uint64_t(0));
  }
  if (s.m_bucket < 1 || s.n < 1 || s.k < 1) return false;
  if (kind == "gemv") {
    t.kind = GemmKind::gemv;
    // Only a tactic gemv can run: the tuner offers the GEMV only where gemv_supported holds.
    // Word 3 is the tiles, one written as 0; the words are small, so the int casts keep them (a bad value
    // makes no known config).
    bool ok = t.algo[0] <= 16 && t.algo[1] <= 1 && t.algo[2] <= 1 && t.algo[3] != 1 && t.algo[3] <= 4 &&
              gemv_supported(s.m_bucket, s.n, s.k, s.k, s.k, s.n, gemv_epilogue(s.out));
    for (int i = 4; i < 8; ++i) ok = ok && t.algo[i] == 0;
    t.gemv = GemvConfig{int(t.algo[0]), t.algo[1] == 1, t.algo[3] == 0 ? 1 : int(t.algo[3])};
    t.gemv_norm_in = t.algo[2] == 1;
    if (!ok || !gemv_known_config(t.gemv) || (t.gemv_norm_in && !gemv_fusable(t.gemv))) return false;
    std::fill(std::begin(t.algo), std::end(t.algo), uint64_t(0));
  }
  std::string rest;
  std::getline(is, rest);
  if (const auto hash = rest.find("# "); hash != std::string::npos) t.describe = rest.substr(hash + 2);
  return true;
}

int64_t gemm_m_bucket(int64_t m) {
  KILN_CHECK_GT(m, 0, "GEMM M must be positive");
  int64_t b = 1;
  while (b < m && b < kMaxBucket) b *= 2;
  return b;
}

struct GemmEngine::Impl {
  int device = 0;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  std::string gpu_name;
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int64_t, int64_t, int64_t>, Plan> plans;
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
  std::vector<cublasLtMatmulHeuristicResult_t> heuristic(const Plan& p, int count) const {
    cublasLtMatmulPreference_t pref = nullptr;
    KILN_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspaceBytes;
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

  bool check(const Plan& p, const cublasLtMatmulAlgo_t& algo) const {
    cublasLtMatmulHeuristicResult_t r{};
    if (cublasLtMatmulAlgoCheck(lt, p.op, p.a, p.b, p.d, p.d, &algo, &r) != CUBLAS_STATUS_SUCCESS)
      return false;
    return r.workspaceSize <= kWorkspaceBytes;
  }

  void matmul(const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* x, const void* w, void* out,
              cudaStream_t stream) const {
    const float alpha = 1.0f, beta = 0.0f;
    KILN_LT_CHECK(cublasLtMatmul(lt, p.op, &alpha, w, p.a, x, p.b, &beta, out, p.d, out, p.d, &algo,
                                 workspace, kWorkspaceBytes, stream));
  }
};

GemmEngine::GemmEngine(int device) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  KILN_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  impl_->gpu_name = prop.name;
  KILN_LT_CHECK(cublasLtCreate(&impl_->lt));
  KILN_CUDA_CHECK(cudaMalloc(&impl_->workspace, kWorkspaceBytes));
  // KILN_GEMV=0: ignore tuned GEMV tactics (cuBLASLt only), a switch to fall back without re-tuning.
  gemv_enabled_ = env_switch("KILN_GEMV", gemv_enabled_);
  gemv_add_rms_norm_ = env_switch("KILN_GEMV_ADD_RMS_NORM", gemv_add_rms_norm_);
  gemv_attn_prep_ = env_switch("KILN_GEMV_ATTN_PREP", gemv_attn_prep_);
  if (const char* e = std::getenv("KILN_GEMV_NORM_IN"); e && *e) {
    KILN_CHECK(std::string(e) == "0" || std::string(e) == "1" || std::string(e) == "2",
               "KILN_GEMV_NORM_IN must be 0, 1 or 2, got '", e, "'");
    gemv_norm_in_ = std::atoi(e);
  }
}

GemmEngine::~GemmEngine() {
  for (auto& [key, plan] : impl_->plans) destroy(plan);
  for (void* b : impl_->retired) cudaFree(b);
  for (void* b : {impl_->staging.ptr, impl_->fp8_scratch.ptr, impl_->fp8_ws.ptr})
    if (b) cudaFree(b);
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->lt) cublasLtDestroy(impl_->lt);
}

std::string GemmEngine::key() const {
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  std::ostringstream os;
  os << impl_->gpu_name << "|cudart " << rt << "|cublasLt " << cublasLtGetVersion();
  return os.str();
}

std::optional<GemvConfig> GemmEngine::gemv_choice(int64_t m, int64_t n, int64_t k, GemmOut out_type,
                                                  GemmWeight weight) const {
  if (!gemv_enabled_ || m < 1 || m > kGemvMaxM) return std::nullopt;
  const auto tuned = tactics_.find(GemmShape{gemm_m_bucket(m), n, k, out_type, weight});
  if (tuned == tactics_.end() || tuned->second.kind != GemmKind::gemv) return std::nullopt;
  return tuned->second.gemv;
}

std::optional<GemvConfig> GemmEngine::gemv_norm_in_choice(int64_t m, int64_t n, int64_t k,
                                                          GemmWeight weight) const {
  if (gemv_norm_in_ == 0) return std::nullopt;
  const auto g = gemv_choice(m, n, k, GemmOut::bf16, weight);
  if (!g || !gemv_fusable(*g)) return std::nullopt;
  if (gemv_norm_in_ == 2) return g;
  return tactics_.at(GemmShape{gemm_m_bucket(m), n, k, GemmOut::bf16, weight}).gemv_norm_in ? g
                                                                                            : std::nullopt;
}

void GemmEngine::run(const void* x, int64_t ldx, const GemvWeight& w, void* out, int64_t ldo, int64_t m,
                     int64_t n, int64_t k, GemmOut out_type, cudaStream_t stream, bool pdl) {
  if (!w.is_fp8()) return run(x, ldx, w.data, w.ld, out, ldo, m, n, k, out_type, stream, pdl);
  KILN_CHECK(m > 0 && n > 0 && k > 0, "GEMM shape must be positive: M ", m, " N ", n, " K ", k);
  KILN_CHECK(w.ld >= k && ldo >= n, "GEMM row strides must be >= the row length: ldw ", w.ld, " ldo ", ldo,
             " for N ", n, " K ", k);
  const bool fp8_aligned = reinterpret_cast<uintptr_t>(w.data) % 8 == 0 &&
                           reinterpret_cast<uintptr_t>(w.scale) % 4 == 0 && aligned16(x) && aligned16(out);
  if (const auto g = gemv_choice(m, n, k, out_type, GemmWeight::fp8);
      g && fp8_aligned && gemv_supported(m, n, k, ldx, w.ld, ldo, gemv_epilogue(out_type))) {
    gemv(x, ldx, w, out, ldo, m, n, k, gemv_epilogue(out_type), *g, stream, pdl);
    ++gemv_dispatches_;
    return;
  }
  // The W8A8 GEMM where the tuner chose it for this bucket and it takes the call.
  if (const auto tuned = tactics_.find(GemmShape{gemm_m_bucket(m), n, k, out_type, GemmWeight::fp8});
      tuned != tactics_.end() && tuned->second.kind == GemmKind::fp8gemm && out_type == GemmOut::bf16 &&
      fp8_gemm_supported(m, n, k, ldx, w.ld, ldo) && aligned16(w.data) && aligned16(x) && aligned16(out)) {
    const int64_t ws_bytes = fp8_gemm_workspace_bytes(m, k);
    if (void* ws = impl_->grow(impl_->fp8_ws, size_t(ws_bytes), 0, stream)) {
      fp8_gemm(x, ldx, w.data, w.ld, w.scale, out, ldo, m, n, k, ws, int64_t(impl_->fp8_ws.bytes),
               tuned->second.fp8gemm, stream);
      ++fp8_gemm_dispatches_;
      return;
    }
  }
  void* deq = impl_->fp8_scratch_for(size_t(n * k) * 2, stream);
  dequantize_fp8(w.data, w.ld, w.scale, deq, n, k, stream);
  ++fp8_dequant_dispatches_;
  // No PDL: the bf16 GEMV's W loads before its PDL wait would race the dequantization (gemv.h).
  run(x, ldx, deq, k, out, ldo, m, n, k, out_type, stream, /*pdl=*/false);
}

void GemmEngine::reserve_fp8_gemm(int64_t m, int64_t k) {
  KILN_CHECK(m >= 0 && k >= 0, "reserve_fp8_gemm: negative size ", m, " x ", k);
  if (m > 0 && k > 0) impl_->grow(impl_->fp8_ws, size_t(fp8_gemm_workspace_bytes(m, k)), 0, nullptr);
}

void GemmEngine::reserve_fp8_dequant(int64_t elements) {
  KILN_CHECK(elements >= 0, "reserve_fp8_dequant: negative size ", elements);
  impl_->fp8_scratch_for(size_t(elements) * 2, nullptr);
}

void GemmEngine::run(const void* x, int64_t ldx, const void* w, int64_t ldw, void* out, int64_t ldo,
                     int64_t m, int64_t n, int64_t k, GemmOut out_type, cudaStream_t stream, bool pdl) {
  KILN_CHECK(m > 0 && n > 0 && k > 0, "GEMM shape must be positive: M ", m, " N ", n, " K ", k);
  KILN_CHECK(ldx >= k && ldw >= k && ldo >= n, "GEMM row strides must be >= the row length: ldx ", ldx,
             " ldw ", ldw, " ldo ", ldo, " for M ", m, " N ", n, " K ", k);
  // cuBLASLt's bf16 kernels and the GEMV read x and W in 16-byte vectors.
  const bool inputs_aligned = k % 8 == 0 && ldx % 8 == 0 && ldw % 8 == 0 && aligned16(x) && aligned16(w);
  if (!inputs_aligned) {
    ++any_shape_dispatches_;
    gemm_any(x, ldx, w, ldw, out, ldo, m, n, k, out_type == GemmOut::f32, stream, pdl);
    return;
  }
  // The GEMV writes scalars: any N and output stride.
  if (const auto g = gemv_choice(m, n, k, out_type);
      g && aligned16(out) && gemv_supported(m, n, k, ldx, ldw, ldo, gemv_epilogue(out_type))) {
    gemv(x, ldx, w, ldw, out, ldo, m, n, k, gemv_epilogue(out_type), *g, stream, pdl);
    ++gemv_dispatches_;
    return;
  }
  if (ldo % 8 == 0 && aligned16(out) && run_cublaslt(x, ldx, w, ldw, out, ldo, m, n, k, out_type, stream))
    return;
  // The output rows are not 16-byte aligned (N = 151,669, Qwen3-Embedding-0.6B's vocabulary, as a logits
  // row stride): cuBLASLt writes aligned rows into the staging buffer, then one 2-D copy moves them. This
  // keeps the tuned tactic (tuned at this stride) and costs M x N elements of copy, small beside the N x K
  // weight read; padding the weight at load could not help, since the caller's output stride is the one
  // misaligned.
  const int64_t lds = aligned_ld(n);
  const size_t es = out_type == GemmOut::f32 ? 4 : 2;
  // Null where it would grow inside a graph capture; then, as where cuBLASLt has no algorithm, the any-shape
  // kernel, which needs no memory.
  void* staged = ldo % 8 == 0 && aligned16(out) ? nullptr : impl_->staging_for(size_t(m * lds) * es, stream);
  if (staged && run_cublaslt(x, ldx, w, ldw, staged, lds, m, n, k, out_type, stream)) {
    KILN_CUDA_CHECK(cudaMemcpy2DAsync(out, size_t(ldo) * es, staged, size_t(lds) * es, size_t(n) * es,
                                      size_t(m), cudaMemcpyDeviceToDevice, stream));
    ++staged_dispatches_;
    return;
  }
  ++any_shape_dispatches_;
  gemm_any(x, ldx, w, ldw, out, ldo, m, n, k, out_type == GemmOut::f32, stream, pdl);
}

bool GemmEngine::run_cublaslt(const void* x, int64_t ldx, const void* w, int64_t ldw, void* out, int64_t ldo,
                              int64_t m, int64_t n, int64_t k, GemmOut out_type, cudaStream_t stream) {
  auto [it, fresh] = impl_->plans.try_emplace({m, n, k, int(out_type), ldx, ldw, ldo});
  Plan& p = it->second;
  if (fresh) {
    try {
      p = make_descriptors(m, n, k, out_type, ldx, ldw, ldo);
      const auto tuned = tactics_.find(GemmShape{gemm_m_bucket(m), n, k, out_type});
      if (tuned != tactics_.end() && tuned->second.kind == GemmKind::cublaslt) {
        std::memcpy(&p.algo, tuned->second.algo, sizeof(p.algo));
        p.have_algo = impl_->check(p, p.algo);
      }
      if (!p.have_algo) {
        ++fallbacks_;
        const auto h = impl_->heuristic(p, 1);
        if (h.empty()) {  // no cuBLASLt algorithm for this shape: the caller runs the any-shape kernel
          destroy(p);
          impl_->plans.erase(it);
          return false;
        }
        p.algo = h[0].algo;
        p.have_algo = true;
      }
    } catch (...) {
      destroy(p);
      impl_->plans.erase(it);  // no half-made plan is ever reused
      throw;
    }
  }
  impl_->matmul(p, p.algo, x, w, out, stream);
  return true;
}

void GemmEngine::tune(const std::vector<GemmShape>& shapes, bool verbose) {
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
  // The W8A8 GEMM's shapes (FP8 weights, M buckets past the GEMV's): its workspace and the scratch path's
  // dequantized weight.
  size_t fp8_ws_bytes = 0, fp8_deq_bytes = 0;
  for (const auto& s : shapes)
    if (s.weight == GemmWeight::fp8 && s.m_bucket > kGemvMaxM) {
      fp8_ws_bytes = std::max(fp8_ws_bytes, size_t(fp8_gemm_workspace_bytes(s.m_bucket, s.k)));
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
    std::vector<Fp8GemmConfig> f8;
    if (s.out == GemmOut::bf16 && fp8_gemm_supported(s.m_bucket, s.n, s.k, s.k, s.k, ldo))
      for (const Fp8GemmConfig& c : kFp8GemmConfigs)
        if (!c.tma_store) f8.push_back(c);  // the TMA-store epilogues wrote past N where ldo > N (2026-12-06)
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
    float best = 1e30f;
    size_t best_i = 0;
    for (size_t i = 0; i < cands.size() + gemv_cands.size(); ++i) {
      if (i < cands.size() && !impl_->check(p, cands[i])) continue;
      const float us = time_us([&](int64_t it) { call(i, it); });
      if (us < best) best = us, best_i = i;
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
      if (s.out == GemmOut::bf16 && gemv_fusable(t.gemv) &&
          gemv_norm_in_supported(s.m_bucket, s.n, s.k, s.k, s.k, s.k, s.n, GemvEpilogue::bf16)) {
        const float pair = time_us([&](int64_t it) {
          rms_norm(x, s.k, norm_res, s.k, w0, norm_out, s.k, s.m_bucket, s.k, 1e-6f, /*add=*/true, stream,
                   /*pdl=*/true);
          gemv(norm_out, s.k, weight_at(it), o, s.n, s.m_bucket, s.n, s.k, GemvEpilogue::bf16, t.gemv, stream,
               /*pdl=*/true);
        });
        const float fused = time_us([&](int64_t it) {
          ::kiln::cuda::gemv_norm_in(x, s.k, norm_res, s.k, w0, 1e-6f, weight_at(it), o, s.n, s.m_bucket, s.n,
                                     s.k, GemvEpilogue::bf16, t.gemv, stream, /*pdl=*/true);
        });
        t.gemv_norm_in = fused < pair;
        if (t.gemv_norm_in) t.describe += " +norm-in";
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

bool GemmEngine::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return false;
  std::string line;
  if (!std::getline(in, line) || (line != kCacheFormat && line != kCacheFormatV2))
    return false;  // absent, or an older format
  if (!std::getline(in, line) || line != "key " + key()) return false;
  std::map<GemmShape, GemmTactic> loaded;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    GemmShape s;
    GemmTactic t;
    if (!parse_tactic_line(line, s, t)) return false;  // a damaged file: re-tune rather than guess
    loaded[s] = t;
  }
  tactics_ = std::move(loaded);
  for (auto& [k, plan] : impl_->plans) destroy(plan);
  impl_->plans.clear();
  return true;
}

void GemmEngine::save(const std::string& path) const {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  // A unique temporary, then a rename: a reader never sees half a file, and two processes tuning at once
  // (the GPU tests under ctest -j) never write the same temporary.
  write_file_atomically(path, [&](std::ostream& out) {
    out << kCacheFormat << "\nkey " << key() << "\n";
    for (const auto& [s, t] : tactics_) out << format_tactic_line(s, t) << "\n";
  });
}

std::vector<GemmShape> qwen3_gemm_shapes(int64_t hidden, int64_t q_size, int64_t kv_size, int64_t inter,
                                         int64_t vocab, int64_t max_tokens, int64_t max_logit_rows,
                                         bool fp8_weights) {
  std::vector<GemmShape> shapes;
  for (int64_t mb = 1; mb <= gemm_m_bucket(max_tokens); mb *= 2) {
    if (fp8_weights) {
      shapes.push_back({mb, q_size + 2 * kv_size, hidden, GemmOut::bf16, GemmWeight::fp8});
      shapes.push_back({mb, hidden, q_size, GemmOut::bf16, GemmWeight::fp8});
      shapes.push_back({mb, 2 * inter, hidden, GemmOut::bf16, GemmWeight::fp8});
      shapes.push_back({mb, hidden, inter, GemmOut::bf16, GemmWeight::fp8});
    }
    shapes.push_back({mb, q_size + 2 * kv_size, hidden, GemmOut::bf16});
    shapes.push_back({mb, hidden, q_size, GemmOut::bf16});
    shapes.push_back({mb, 2 * inter, hidden, GemmOut::bf16});
    shapes.push_back({mb, hidden, inter, GemmOut::bf16});
    if (max_logit_rows > 0 && mb <= gemm_m_bucket(max_logit_rows))
      shapes.push_back({mb, vocab, hidden, GemmOut::f32});
  }
  return shapes;
}

std::string default_tactic_cache_path() {
  if (const char* p = std::getenv("KILN_TUNE_CACHE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return std::string(x) + "/kiln/gemm_tactics.txt";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kiln/gemm_tactics.txt";
  return "kiln_gemm_tactics.txt";
}

}  // namespace kiln::cuda
