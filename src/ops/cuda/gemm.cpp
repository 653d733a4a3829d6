// cuBLASLt GEMM with the tactic cache: plans (descriptors + chosen algo) per exact (M, N, K, out),
// tactics per (M bucket, N, K, out, weight format), the tactic cache file. See gemm.h for the contract; the
// tuner is gemm_tune.cpp.
#include "ops/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/atomic_file.h"
#include "kiln/cuda_check.h"
#include "kiln/env.h"
#include "kiln/error.h"
#include "ops/cuda/fp8_dequant.h"
#include "ops/cuda/gemm_any.h"
#include "ops/cuda/gemm_impl.h"
#include "ops/cuda/gemv_w8a8.h"

namespace kiln::cuda {

using namespace gemm_detail;

namespace {

constexpr const char* kCacheFormat = "kiln-gemm-tactics v7";
// Older formats still read: v6 (no lighter e4m3 x 16 form: word 7 of a GEMV tactic and word 6 of a W8A8
// tactic's prologue at most 1 and 2), v5 (no split-K W8A8 GEMM: word 5 of an fp8gemm tactic is 0, split_k 1),
// v4 (no e4m3 x 16 GEMV: word 7 of a GEMV tactic is 0), v3 (no W8A8 GEMV: word 4 is 0 too), v2 (bf16 weights
// only).
constexpr const char* kCacheFormatV6 = "kiln-gemm-tactics v6";
constexpr const char* kCacheFormatV5 = "kiln-gemm-tactics v5";
constexpr const char* kCacheFormatV4 = "kiln-gemm-tactics v4";
constexpr const char* kCacheFormatV3 = "kiln-gemm-tactics v3";
constexpr const char* kCacheFormatV2 = "kiln-gemm-tactics v2";

// A GEMV tactic's e4m3 x 16 word (word 7; word 6 of a W8A8 tactic's prologue is this plus 1): 0 not e4m3 x
// 16, 1 the 8-row form, 2 the lighter 4-row form (GemvConfig::x16_rows).
uint64_t x16_word(const GemvConfig& c) {
  return !c.e4m3x16 ? 0 : c.x16_rows == 4 ? 2 : 1;
}

// The e4m3 x 16 fields of x16_word's value w (any other value makes no known config).
void set_x16(GemvConfig& c, uint64_t w) {
  c.e4m3x16 = w != 0;
  c.x16_rows = w == 2 ? 4 : 8;
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
                               : i == 4 ? uint64_t(t.gemv.w8a8)
                               : i == 5 ? uint64_t(t.norm_in_gemv ? t.norm_in_gemv->warps : 0)
                               : i == 6 ? uint64_t(!t.norm_in_gemv           ? 0
                                                   : t.norm_in_gemv->e4m3x16 ? 1 + x16_word(*t.norm_in_gemv)
                                                                             : t.norm_in_gemv->tensor_cores)
                                        : x16_word(t.gemv);
    const Fp8GemmConfig& f = t.fp8gemm;
    const uint64_t fp8_word = i == 0   ? uint64_t(f.tile_n)
                              : i == 1 ? uint64_t(f.stages)
                              : i == 2 ? uint64_t(f.persistent)
                              : i == 3 ? uint64_t(f.cluster)
                              : i == 4 ? uint64_t(f.tma_store)
                              : i == 5 ? uint64_t(f.split_k == 1 ? 0 : f.split_k)
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
    // Word 5: split_k, 1 written as 0 (v5 lines, which have no split, read as split_k 1).
    t.fp8gemm = Fp8GemmConfig{int(t.algo[0] & 0xffff), int(t.algo[1] & 0xffff),
                              t.algo[2] == 1,          int(t.algo[3] & 0xffff),
                              t.algo[4] == 1,          t.algo[5] == 0 ? 1 : int(t.algo[5] & 0xffff)};
    bool ok = t.algo[2] <= 1 && t.algo[4] <= 1 && t.algo[5] != 1 && s.out == GemmOut::bf16 && s.m_bucket >= 1;
    for (int i = 6; i < 8; ++i) ok = ok && t.algo[i] == 0;
    for (int i = 0; i < 6; ++i) ok = ok && t.algo[i] <= 0xffff;
    bool known = false;
    for (const Fp8GemmConfig& c : kFp8GemmConfigs) known = known || c == t.fp8gemm;
    if (!ok || !known) return false;
    std::fill(std::begin(t.algo), std::end(t.algo), uint64_t(0));
  }
  if (s.m_bucket < 1 || s.n < 1 || s.k < 1) return false;
  if (kind == "gemv") {
    t.kind = GemmKind::gemv;
    // Only a tactic gemv can run: the tuner offers the GEMV only where gemv_supported (W8A8:
    // gemv_w8a8_shape_supported, for an FP8 weight) holds. Word 3 is the tiles, one written as 0; word 4 the
    // W8A8 kernel's K blocks in flight (0: not W8A8). The words are small, so the int casts keep them (a bad
    // value makes no known config).
    const bool w8a8 = t.algo[4] != 0;
    bool ok = t.algo[0] <= 16 && t.algo[1] <= 1 && t.algo[2] <= 1 && t.algo[3] != 1 && t.algo[3] <= 4 &&
              t.algo[4] <= 4 && (!w8a8 || s.weight == GemmWeight::fp8) &&
              (w8a8 ? gemv_w8a8_shape_supported(s.m_bucket, s.n, s.k, s.k, s.k, s.n, gemv_epilogue(s.out))
                    : gemv_supported(s.m_bucket, s.n, s.k, s.k, s.k, s.n, gemv_epilogue(s.out)));
    // Word 7: the e4m3 x 16 format (an FP8 weight's, K a multiple of 16), 1 or 2 (x16_word; v6 files: 1).
    ok = ok && t.algo[7] <= 2 && (t.algo[7] == 0 || (s.weight == GemmWeight::fp8 && s.k % 16 == 0)) &&
         t.algo[5] <= 16 && t.algo[6] <= 3;
    t.gemv = GemvConfig{int(t.algo[0]), t.algo[1] == 1, t.algo[3] == 0 ? 1 : int(t.algo[3]), int(t.algo[4])};
    set_x16(t.gemv, t.algo[7]);
    t.gemv_norm_in = t.algo[2] == 1;
    // A W8A8 config's prologue: its own (words 5 and 6 zero) or the W8A16 config of words 5 and 6 (word 6: 1
    // the tensor-core kernel, 2 or 3 an e4m3 x 16 config, x16_word + 1).
    if (w8a8 && t.gemv_norm_in && t.algo[5] != 0) {
      GemvConfig c{.warps = int(t.algo[5]), .tensor_cores = t.algo[6] == 1};
      set_x16(c, t.algo[6] >= 2 ? t.algo[6] - 1 : 0);
      t.norm_in_gemv = c;
    }
    if (!(w8a8 && t.gemv_norm_in)) ok = ok && t.algo[5] == 0 && t.algo[6] == 0;
    ok = ok && (t.algo[5] != 0 || t.algo[6] == 0);
    const GemvConfig prologue = t.norm_in_gemv.value_or(t.gemv);
    if (!ok || !gemv_known_config(t.gemv) || !gemv_known_config(prologue) ||
        (t.gemv_norm_in && !gemv_norm_in_fusable(prologue) && prologue.w8a8 == 0))
      return false;
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
  verify_tactics_ = env_switch("KILN_VERIFY_TACTICS", verify_tactics_);
  if (const char* e = std::getenv("KILN_FP8_FUSED_ACT_QUANT"); e && *e)
    set_fp8_fused_act_quant(env_switch("KILN_FP8_FUSED_ACT_QUANT", true));
  gemv_norm_in_tiles_ = env_switch("KILN_GEMV_NORM_IN_TILES", gemv_norm_in_tiles_);
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

int64_t GemmEngine::tactic_bucket(int64_t m) const {
  // The plain step's bucket whether it has a tactic or not: without one the plain step ran cuBLASLt's
  // heuristic, which run_cublaslt then asks for the plain step's M.
  return tactic_rows_ > 0 && verify_tactics_ && m <= kGemvMaxM ? gemm_m_bucket(tactic_rows_)
                                                               : gemm_m_bucket(m);
}

std::optional<GemvConfig> GemmEngine::gemv_choice(int64_t m, int64_t n, int64_t k, GemmOut out_type,
                                                  GemmWeight weight) const {
  if (!gemv_enabled_ || m < 1 || m > kGemvMaxM) return std::nullopt;
  const auto tuned = tactics_.find(GemmShape{tactic_bucket(m), n, k, out_type, weight});
  if (tuned == tactics_.end() || tuned->second.kind != GemmKind::gemv) return std::nullopt;
  return tuned->second.gemv;
}

std::optional<GemvConfig> GemmEngine::gemv_norm_in_choice(int64_t m, int64_t n, int64_t k,
                                                          GemmWeight weight) const {
  if (gemv_norm_in_ == 0) return std::nullopt;
  const auto g = gemv_choice(m, n, k, GemmOut::bf16, weight);
  if (!g) return std::nullopt;
  const GemmTactic& t = tactics_.at(GemmShape{tactic_bucket(m), n, k, GemmOut::bf16, weight});
  // A W8A8 tactic's W8A16 prologue config (GemmTactic::norm_in_gemv), where it was measured faster; else the
  // tactic's own config (W8A8 configs have their prologue: gemv_w8a8_norm_in).
  const GemvConfig c = t.norm_in_gemv.value_or(*g);
  if (!gemv_norm_in_fusable(c) && c.w8a8 == 0) return std::nullopt;
  if (c.tiles > 1 && c.w8a8 == 0 && !gemv_norm_in_tiles_) return std::nullopt;  // switched off
  if (gemv_norm_in_ == 2) return c;
  if (gemv_norm_in_off_at(tactic_bucket(m))) return std::nullopt;
  return t.gemv_norm_in ? std::optional<GemvConfig>(c) : std::nullopt;
}

void GemmEngine::set_gemv_norm_in_off_at(int64_t m_bucket, bool off) {
  auto& v = norm_in_off_buckets_;
  v.erase(std::remove(v.begin(), v.end(), m_bucket), v.end());
  if (off) v.push_back(m_bucket);
}

bool GemmEngine::gemv_norm_in_off_at(int64_t m_bucket) const {
  return std::find(norm_in_off_buckets_.begin(), norm_in_off_buckets_.end(), m_bucket) !=
         norm_in_off_buckets_.end();
}

bool GemmEngine::gemv_norm_in_tuned_at(int64_t m) const {
  if (!gemv_enabled_ || gemv_norm_in_ != 1 || m < 1 || m > kGemvMaxM) return false;
  const int64_t b = tactic_bucket(m);
  for (const auto& [shape, t] : tactics_)
    if (shape.m_bucket == b && shape.out == GemmOut::bf16 && t.kind == GemmKind::gemv && t.gemv_norm_in)
      return true;
  return false;
}

void GemmEngine::run(const void* x, int64_t ldx, const GemvWeight& w, void* out, int64_t ldo, int64_t m,
                     int64_t n, int64_t k, GemmOut out_type, cudaStream_t stream, bool pdl) {
  if (!w.is_fp8()) return run(x, ldx, w.data, w.ld, out, ldo, m, n, k, out_type, stream, pdl);
  KILN_CHECK(m > 0 && n > 0 && k > 0, "GEMM shape must be positive: M ", m, " N ", n, " K ", k);
  KILN_CHECK(w.ld >= k && ldo >= n, "GEMM row strides must be >= the row length: ldw ", w.ld, " ldo ", ldo,
             " for N ", n, " K ", k);
  if (const auto g = gemv_choice(m, n, k, out_type, GemmWeight::fp8);
      g && gemv_takes(*g, x, ldx, w, out, ldo, m, n, k, gemv_epilogue(out_type))) {
    gemv(x, ldx, w, out, ldo, m, n, k, gemv_epilogue(out_type), *g, stream, pdl);
    ++gemv_dispatches_;
    return;
  }
  // The W8A8 GEMM where the tuner chose it for this bucket (or the nearest tuned bucket below) and it takes
  // the call.
  if (const GemmTactic* tuned = w8a8_tactic(w, ldx, out, ldo, m, n, k, out_type); tuned && aligned16(x)) {
    const int64_t ws_bytes = fp8_gemm_workspace_bytes(m, n, k, tuned->fp8gemm);  // a split's partials too
    if (void* ws = impl_->grow(impl_->fp8_ws, size_t(ws_bytes), 0, stream)) {
      fp8_gemm(x, ldx, w.data, w.ld, w.scale, out, ldo, m, n, k, ws, int64_t(impl_->fp8_ws.bytes),
               tuned->fp8gemm, stream);
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

const GemmTactic* GemmEngine::fp8_tactic_at_or_below(int64_t m, int64_t n, int64_t k,
                                                     GemmOut out_type) const {
  // Buckets up to kGemvMaxM belong to the GEMV's configs: none of them lends its tactic to a larger M, and
  // an untuned one of them borrows none.
  const int64_t top = gemm_m_bucket(m);
  for (int64_t b = top; b == top || b > kGemvMaxM; b /= 2)
    if (const auto t = tactics_.find(GemmShape{b, n, k, out_type, GemmWeight::fp8}); t != tactics_.end())
      return &t->second;
  return nullptr;
}

const GemmTactic* GemmEngine::w8a8_tactic(const GemvWeight& w, int64_t ldx, const void* out, int64_t ldo,
                                          int64_t m, int64_t n, int64_t k, GemmOut out_type) const {
  const GemmTactic* t = fp8_tactic_at_or_below(m, n, k, out_type);
  return t && t->kind == GemmKind::fp8gemm && out_type == GemmOut::bf16 &&
                 fp8_gemm_supported(m, n, k, ldx, w.ld, ldo) && aligned16(w.data) && aligned16(out)
             ? t
             : nullptr;
}

bool GemmEngine::fp8_gemm_takes(const GemvWeight& w, const void* out, int64_t ldo, int64_t m, int64_t n,
                                int64_t k) const {
  // run()'s W8A8 choice for an input of row stride K (the workspace's), at sizes past the GEMV's.
  return m >= fp8_fused_act_quant_min_m_ && w.is_fp8() && m > kGemvMaxM && n >= 1 && k >= 1 &&
         w8a8_tactic(w, k, out, ldo, m, n, k, GemmOut::bf16) != nullptr;
}

GemmEngine::Fp8Input GemmEngine::fp8_gemm_input(const GemvWeight& w, const void* out, int64_t ldo, int64_t m,
                                                int64_t n, int64_t k, cudaStream_t stream) {
  if (!fp8_gemm_takes(w, out, ldo, m, n, k)) return {};
  const int64_t bytes =
      fp8_gemm_workspace_bytes(m, n, k, w8a8_tactic(w, k, out, ldo, m, n, k, GemmOut::bf16)->fp8gemm);
  void* ws = impl_->grow(impl_->fp8_ws, size_t(bytes), 0, stream);
  return ws ? Fp8Input{ws, int64_t(impl_->fp8_ws.bytes)} : Fp8Input{};
}

void GemmEngine::run_prequantized(const GemvWeight& w, void* out, int64_t ldo, int64_t m, int64_t n,
                                  int64_t k, cudaStream_t stream) {
  KILN_CHECK(fp8_gemm_takes(w, out, ldo, m, n, k), "run_prequantized: the W8A8 GEMM does not take M ", m,
             " N ", n, " K ", k, " (fp8_gemm_takes)");
  const Fp8GemmConfig cfg = w8a8_tactic(w, k, out, ldo, m, n, k, GemmOut::bf16)->fp8gemm;
  KILN_CHECK(impl_->fp8_ws.ptr && int64_t(impl_->fp8_ws.bytes) >= fp8_gemm_workspace_bytes(m, n, k, cfg),
             "run_prequantized: no workspace filled for M ", m, " K ", k, " (fp8_gemm_input first)");
  fp8_gemm_quantized(w.data, w.ld, w.scale, out, ldo, m, n, k, impl_->fp8_ws.ptr,
                     int64_t(impl_->fp8_ws.bytes), cfg, stream);
  ++fp8_gemm_dispatches_;
  ++fp8_prequantized_dispatches_;
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
  // A verify step's call takes the plain step's tactic (set_tactic_rows), and where that shape has none the
  // algorithm the heuristic gives the plain step's M: plans are kept per (bucket, plain M) too.
  const int64_t bucket = tactic_bucket(m);
  const int64_t plain_m = tactic_rows_ > 0 && verify_tactics_ && m <= kGemvMaxM ? tactic_rows_ : 0;
  auto [it, fresh] = impl_->plans.try_emplace({m, n, k, int(out_type), ldx, ldw, ldo, bucket, plain_m});
  Plan& p = it->second;
  if (fresh) {
    try {
      p = make_descriptors(m, n, k, out_type, ldx, ldw, ldo);
      const auto tuned = tactics_.find(GemmShape{bucket, n, k, out_type});
      if (tuned != tactics_.end() && tuned->second.kind == GemmKind::cublaslt) {
        std::memcpy(&p.algo, tuned->second.algo, sizeof(p.algo));
        p.have_algo = impl_->check(p, p.algo);
      }
      if (!p.have_algo && plain_m > 0 && plain_m != m) {
        Plan plain = make_descriptors(plain_m, n, k, out_type, ldx, ldw, ldo);
        const auto h = impl_->heuristic(plain, 1);
        destroy(plain);
        if (!h.empty() && impl_->check(p, h[0].algo)) p.algo = h[0].algo, p.have_algo = true;
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

bool GemmEngine::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return false;
  std::string line;
  if (!std::getline(in, line)) return false;
  if (line != kCacheFormat && line != kCacheFormatV6 && line != kCacheFormatV5 && line != kCacheFormatV4 &&
      line != kCacheFormatV3 && line != kCacheFormatV2) {
    std::fprintf(stderr, "kiln: tactic cache %s has format '%s', not '%s': ignored (tuning replaces it)\n",
                 path.c_str(), line.c_str(), kCacheFormat);
    return false;
  }
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
