// ops/moe.h on the GPU: the scratch carving and the sequence of moe.h's launches.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kiln/env.h"
#include "kiln/error.h"
#include "ops/cuda/context.h"
#include "ops/cuda/fp8_dequant.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/moe_ops.h"
#include "ops/cuda/ops_cuda.h"

namespace kiln::cuda {
namespace {

constexpr size_t kAlign = 256;

std::atomic<int> g_fp8_wide_loads{-1};  // -1: not read yet
std::atomic<int> g_fp8_e4m3x16{-1};     // -1: not read yet

// A 0 / 1 switch read once from the environment into `cell` (-1: not read yet), unless a setter got there
// first.
bool cached_switch(std::atomic<int>& cell, const char* name, bool fallback) {
  int v = cell.load(std::memory_order_relaxed);
  if (v < 0) {
    v = env_switch(name, fallback) ? 1 : 0;
    int unset = -1;
    cell.compare_exchange_strong(unset, v);  // an override set meanwhile wins
    v = cell.load(std::memory_order_relaxed);
  }
  return v == 1;
}

// Walks the parts in MoeBuffers order; with base == nullptr it only sums their sizes.
struct Carver {
  char* base;
  size_t used = 0;
  template <typename T>
  T* take(int64_t n) {
    T* p = base ? reinterpret_cast<T*>(base + used) : nullptr;
    used += (size_t(n) * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    return p;
  }
};

MoeBuffers carve(const MoeShape& s, Carver& c) {
  MoeBuffers b{};
  b.logits = c.take<uint16_t>(s.T * s.E);
  b.experts = c.take<int32_t>(s.T * s.k);
  b.weights = c.take<uint16_t>(s.T * s.k);
  b.rank = c.take<int32_t>(s.T * s.k);
  b.chunk_counts = c.take<int32_t>(s.chunks() * s.E);
  b.counts = c.take<int32_t>(s.E);
  b.offsets = c.take<int32_t>(s.E + 1);
  b.tile_expert = c.take<int32_t>(s.max_tiles());
  b.num_tiles = c.take<int32_t>(1);
  b.active = c.take<int32_t>(s.E + 1);
  b.sorted_pair = c.take<int32_t>(s.max_rows());
  b.inverse = c.take<int32_t>(s.T * s.k);
  b.act = c.take<uint16_t>(s.max_rows() * s.I);
  b.y = c.take<uint16_t>(s.max_rows() * s.H);
  b.gate_up_bf16 = s.fp8_dequant ? c.take<uint16_t>(s.local_experts() * 2 * s.I * s.H) : nullptr;
  b.down_bf16 = s.fp8_dequant ? c.take<uint16_t>(s.local_experts() * s.H * s.I) : nullptr;
  const int64_t kmax = s.H > s.I ? s.H : s.I;
  b.act_q = s.fp8_w8a8 ? c.take<uint8_t>(s.max_rows() * kmax) : nullptr;
  b.act_qs = s.fp8_w8a8 ? c.take<float>((kmax + 127) / 128 * s.max_rows()) : nullptr;
  return b;
}

}  // namespace

bool moe_router_cluster_enabled() {
  static const bool on = env_switch("KILN_MOE_ROUTER_CLUSTER", kMoeRouterClusterDefault);
  return on;
}

bool moe_fp8_wide_loads() {
  return cached_switch(g_fp8_wide_loads, "KILN_MOE_FP8_WIDE_LOADS", kMoeFp8WideLoadsDefault);
}

void moe_set_fp8_wide_loads(bool on) {
  g_fp8_wide_loads.store(on ? 1 : 0, std::memory_order_relaxed);
}

bool moe_fp8_e4m3x16() {
  return cached_switch(g_fp8_e4m3x16, "KILN_MOE_FP8_E4M3X16", kMoeFp8E4m3x16Default);
}

void moe_set_fp8_e4m3x16(bool on) {
  g_fp8_e4m3x16.store(on ? 1 : 0, std::memory_order_relaxed);
}

size_t moe_scratch_bytes(const MoeShape& s) {
  Carver c{nullptr};
  carve(s, c);
  return c.used;
}

MoeBuffers moe_scratch_layout(const MoeShape& s, void* base) {
  Carver c{static_cast<char*>(base)};
  return carve(s, c);
}

MoeProductParams moe_gate_up_params(const uint16_t* x, int64_t xs, const uint16_t* gate_up, const MoeShape& s,
                                    const MoeBuffers& b) {
  return {.a = x,
          .as = xs,
          .w = gate_up,
          .out = b.act,
          .sorted_pair = b.sorted_pair,
          .tile_expert = b.tile_expert,
          .num_tiles = b.num_tiles,
          .offsets = b.offsets,
          .counts = b.counts,
          .active = b.active,
          .E = int(s.E),
          .N = int(s.I),
          .K = int(s.H),
          .k = int(s.k),
          .expert_begin = int(s.expert_begin)};
}

MoeProductParams moe_down_params(const uint16_t* down, const MoeShape& s, const MoeBuffers& b) {
  MoeProductParams d = moe_gate_up_params(b.act, s.I, down, s, b);
  d.out = b.y;
  d.N = int(s.H);
  d.K = int(s.I);
  return d;
}

void moe_set_fp8(MoeProductParams& p, const void* w8, const float* scales) {
  p.w = nullptr;
  p.w8 = static_cast<const uint8_t*>(w8);
  p.ws = scales;
  p.skb = (p.K + 127) / 128;
}

namespace {

void product_params(const uint16_t* x, int64_t xs, const void* gate_up, const void* down, const MoeShape& s,
                    const MoeBuffers& b, MoeFp8Scales scales, MoeProductParams& g, MoeProductParams& d) {
  g = moe_gate_up_params(x, xs, static_cast<const uint16_t*>(gate_up), s, b);
  d = moe_down_params(static_cast<const uint16_t*>(down), s, b);
  if (scales.fp8()) {
    moe_set_fp8(g, gate_up, scales.gate_up);
    moe_set_fp8(d, down, scales.down);
  }
}

}  // namespace

void moe_experts_combine_launch(const uint16_t* x, int64_t xs, const void* gate_up, const void* down,
                                const MoeShape& s, const MoeBuffers& b, uint16_t* out, int64_t os,
                                cudaStream_t stream, MoeFp8Scales scales) {
  KILN_CHECK(s.H % 8 == 0 && s.I % 8 == 0 && (!scales.fp8() || (s.H % 128 == 0 && s.I % 128 == 0)),
             "moe_mlp: hidden ", s.H, " and moe_intermediate ", s.I,
             " must be multiples of 8 (of 128 with block-FP8 experts) for the CUDA expert kernels");
  if (s.T == 0) return;
  MoeProductParams g, d;
  product_params(x, xs, gate_up, down, s, b, scales, g, d);
  moe_gather_gemv_launch(s, g, nullptr, stream);
  moe_down_combine_launch(s, d, b, out, os, stream);
}

void moe_experts_launch(MoeExpertKernel kernel, const uint16_t* x, int64_t xs, const void* gate_up,
                        const void* down, const MoeShape& s, const MoeBuffers& b, cudaStream_t stream,
                        MoeFp8Scales scales) {
  KILN_CHECK(s.H % 8 == 0 && s.I % 8 == 0, "moe_mlp: hidden ", s.H, " and moe_intermediate ", s.I,
             " must be multiples of 8 for the CUDA expert kernels (16-byte rows)");
  KILN_CHECK(!scales.fp8() || (s.H % 128 == 0 && s.I % 128 == 0),
             "moe_mlp: block-FP8 experts need hidden and moe_intermediate multiples of 128, got ", s.H,
             " and ", s.I);
  KILN_CHECK(kernel != MoeExpertKernel::grouped_gemm_fp8_sm90 || (scales.fp8() && s.fp8_w8a8),
             "moe_mlp: the W8A8 grouped GEMM takes block-FP8 experts and the scratch's W8A8 workspace "
             "(MoeShape::fp8_w8a8)");
  KILN_CHECK(!scales.fp8() || kernel == MoeExpertKernel::gather_gemv ||
                 kernel == MoeExpertKernel::grouped_gemm_fp8_sm90 || s.fp8_dequant,
             "moe_mlp: block-FP8 experts on a grouped GEMM need the scratch's bf16 expert copy "
             "(MoeShape::fp8_dequant)");
  if (s.T == 0) return;
  if (kernel == MoeExpertKernel::grouped_gemm_fp8_sm90) {  // W8A8: e4m3 x e4m3, no bf16 copy
    MoeProductParams g, d;
    product_params(x, xs, gate_up, down, s, b, scales, g, d);
    return moe_grouped_gemm_fp8_sm90_launch(s, g, d, b, stream);
  }
  if (scales.fp8() && kernel != MoeExpertKernel::gather_gemv) {  // dequantize the chosen experts, then bf16
    const int64_t L = s.local_experts();
    dequantize_fp8_experts(gate_up, scales.gate_up, b.gate_up_bf16, L, 2 * s.I, s.H, b.counts, s.expert_begin,
                           stream);
    dequantize_fp8_experts(down, scales.down, b.down_bf16, L, s.H, s.I, b.counts, s.expert_begin, stream);
    gate_up = b.gate_up_bf16;
    down = b.down_bf16;
    scales = {};
  }
  MoeProductParams g, d;
  product_params(x, xs, gate_up, down, s, b, scales, g, d);
  switch (kernel) {
    case MoeExpertKernel::gather_gemv:
      return moe_gather_gemv_launch(s, g, d, stream);
    case MoeExpertKernel::grouped_gemm_sm90:
      return moe_grouped_gemm_sm90_launch(s, g, d, stream);
    case MoeExpertKernel::grouped_gemm:
      return moe_grouped_gemm_launch(s, g, d, stream);
    case MoeExpertKernel::grouped_gemm_fp8_sm90:
      break;  // launched above
  }
}

}  // namespace kiln::cuda

namespace kiln::ops::cuda {
namespace kc = ::kiln::cuda;
namespace {

kc::MoeShape shape_of(const MoeWeights& w, int64_t H, int64_t T, MoeExperts experts) {
  return {.T = T,
          .E = w.num_experts(),
          .k = w.top_k,
          .H = H,
          .I = w.intermediate(),
          .expert_begin = w.expert_begin,
          .local = w.local_experts(),
          .fp8_dequant = moe_fp8_dequant_runs(w, T, experts),
          .fp8_w8a8 = moe_fp8_w8a8_runs(w, T, experts)};
}

// -2: not read yet; -1: kMoeFp8DequantMinTokens; else a token count >= 0.
std::atomic<int64_t> g_fp8_dequant_min_tokens{-2};
std::atomic<int> g_fp8_w8a8{-1};  // -1: not read yet
// -2: not read yet; -1: kMoeFp8W8a8MinTokens; else a token count >= 1.
std::atomic<int64_t> g_fp8_w8a8_min_tokens{-2};

// -2: not read yet; -1: kMoeGemvMaxTokens; else a token count >= 0.
std::atomic<int64_t> g_gemv_max_tokens{-2};

// A threshold read from its variable once (-1 where unset), unless a setter stored one first.
int64_t read_once(std::atomic<int64_t>& slot, const char* name, int64_t min, const char* meaning) {
  int64_t v = slot.load(std::memory_order_relaxed);
  if (v == -2) {
    int64_t unread = -2;
    slot.compare_exchange_strong(unread, env_count(name, min, -1, meaning));  // a setter wins
    v = slot.load(std::memory_order_relaxed);
  }
  return v;
}

MoeExperts env_experts() {
  static const MoeExperts e = [] {
    const char* v = std::getenv("KILN_MOE_EXPERTS");
    if (!v || !*v) return MoeExperts::by_rows;
    if (std::strcmp(v, "gemm") == 0) return MoeExperts::grouped_gemm;
    if (std::strcmp(v, "gemv") == 0) return MoeExperts::gather_gemv;
    if (std::strcmp(v, "wgmma") == 0) return MoeExperts::grouped_gemm_sm90;
    KILN_FAIL("KILN_MOE_EXPERTS must be gemm, wgmma or gemv, got '", v, "'");
  }();
  return e;
}

}  // namespace

int64_t moe_fp8_dequant_min_tokens() {
  const int64_t v =
      read_once(g_fp8_dequant_min_tokens, "KILN_MOE_FP8_DEQUANT_MIN_TOKENS", 0, " (0: never dequantize)");
  return v < 0 ? kMoeFp8DequantMinTokens : v;
}

void moe_set_fp8_dequant_min_tokens(int64_t tokens) {
  KILN_CHECK(tokens >= 0, "moe_set_fp8_dequant_min_tokens: ", tokens, " < 0");
  g_fp8_dequant_min_tokens.store(tokens, std::memory_order_relaxed);
}

bool moe_fp8_w8a8_enabled() {
  return kc::cached_switch(g_fp8_w8a8, "KILN_MOE_FP8_W8A8", kMoeFp8W8a8Default);
}

void moe_set_fp8_w8a8(bool on) {
  g_fp8_w8a8.store(on ? 1 : 0, std::memory_order_relaxed);
}

int64_t moe_fp8_w8a8_min_tokens() {
  const int64_t v = read_once(g_fp8_w8a8_min_tokens, "KILN_MOE_FP8_W8A8_MIN_TOKENS", 1, "");
  return v < 0 ? kMoeFp8W8a8MinTokens : v;
}

void moe_set_fp8_w8a8_min_tokens(int64_t tokens) {
  KILN_CHECK(tokens >= 1 || tokens == -1, "moe_set_fp8_w8a8_min_tokens: ", tokens, " (>= 1, or -1)");
  g_fp8_w8a8_min_tokens.store(tokens, std::memory_order_relaxed);
}

int64_t moe_gemv_max_tokens() {
  const int64_t v =
      read_once(g_gemv_max_tokens, "KILN_MOE_GEMV_MAX_TOKENS", 0, " (0: the grouped GEMM at every T)");
  return v < 0 ? kMoeGemvMaxTokens : v;
}

void moe_set_gemv_max_tokens(int64_t tokens) {
  KILN_CHECK(tokens >= -1, "moe_set_gemv_max_tokens: ", tokens, " (>= 0, or -1)");
  g_gemv_max_tokens.store(tokens, std::memory_order_relaxed);
}

MoeExperts moe_env_experts() {
  return env_experts();
}

bool moe_fp8_w8a8_runs(const MoeWeights& w, int64_t T, MoeExperts experts) {
  if (!w.is_fp8()) return false;
  if (experts == MoeExperts::grouped_gemm_fp8_w8a8) return true;
  if (experts != MoeExperts::by_rows) return false;
  return moe_fp8_dequant_min_tokens() > 0 && T >= moe_fp8_w8a8_min_tokens() && moe_fp8_w8a8_enabled() &&
         env_experts() != MoeExperts::grouped_gemm && kc::moe_grouped_gemm_fp8_sm90_applies();
}

bool moe_fp8_dequant_runs(const MoeWeights& w, int64_t T, MoeExperts experts) {
  if (!w.is_fp8() || experts == MoeExperts::gather_gemv || experts == MoeExperts::grouped_gemm_fp8_w8a8)
    return false;
  if (experts != MoeExperts::by_rows) return true;
  const int64_t min_tokens = moe_fp8_dequant_min_tokens();
  return min_tokens > 0 && T >= min_tokens && !moe_fp8_w8a8_runs(w, T, experts);
}

size_t moe_scratch_bytes(const MoeWeights& w, int64_t hidden, int64_t T, MoeExperts experts) {
  return kc::moe_scratch_bytes(shape_of(w, hidden, T, experts));
}

void moe_route(const Tensor& logits, int64_t top_k, bool norm_topk_prob, const Tensor& experts,
               const Tensor& weights) {
  const kc::MoeShape s{.T = logits.shape[0], .E = logits.shape[1], .k = top_k, .H = 8, .I = 8};
  if (s.T == 0) return;
  // The route kernel's chunk ranks and counts go to the thread's scratch (not read here).
  kc::MoeBuffers b{};
  b.experts = experts.ptr<int32_t>();
  b.weights = static_cast<uint16_t*>(weights.data);
  b.rank = static_cast<int32_t*>(kc::scratch(size_t(s.T * s.k + s.chunks() * s.E) * 4));
  b.chunk_counts = b.rank + s.T * s.k;
  kc::moe_route_launch(static_cast<const uint16_t*>(logits.data), logits.stride[0], s, norm_topk_prob, b,
                       kc::current_stream());
}

void moe_mlp(const Tensor& x, const MoeWeights& w, const Tensor& out, void* scratch, size_t scratch_bytes,
             MoeExperts experts) {
  moe_mlp_norm_in(nullptr, x, w, out, scratch, scratch_bytes, experts);
}

bool moe_norm_in_applies(int64_t T, int64_t H) {
  return T <= kc::kMoeRouterNormInMaxTokens && H <= kc::kMoeRouterMaxHidden;
}

void moe_mlp_norm_in(const ResidualNorm* in, const Tensor& x, const MoeWeights& w, const Tensor& out,
                     void* scratch, size_t scratch_bytes, MoeExperts experts) {
  const int64_t T = x.shape[0], H = x.shape[1];
  if (T == 0) return;
  const kc::MoeShape s = shape_of(w, H, T, experts);
  const size_t need = kc::moe_scratch_bytes(s);
  KILN_CHECK(scratch && scratch_bytes >= need, "moe_mlp: scratch of ", scratch_bytes, " bytes for ", T,
             " tokens; it needs ", need);
  const kc::MoeBuffers b = kc::moe_scratch_layout(s, scratch);
  const cudaStream_t stream = kc::current_stream();
  if (in) {  // the add + RMSNorm in the router's launch; x is in->normed
    KILN_CHECK(moe_norm_in_applies(T, H) && x.data == in->normed.data,
               "moe_mlp: the norm prologue takes up to ", kc::kMoeRouterNormInMaxTokens,
               " tokens, x its normed rows");
    const kc::MoeNormIn norm{.delta = static_cast<const uint16_t*>(in->delta.data),
                             .ds = in->delta.stride[0],
                             .residual = static_cast<uint16_t*>(in->residual.data),
                             .rs = in->residual.stride[0],
                             .weight = static_cast<const uint16_t*>(in->weight.data),
                             .normed = static_cast<uint16_t*>(in->normed.data),
                             .ns = in->normed.stride[0],
                             .eps = in->eps};
    kc::moe_router_route_launch(nullptr, 0, static_cast<const uint16_t*>(w.router.data), s, w.norm_topk_prob,
                                b, stream, &norm);
  } else if (T <= kc::kMoeRouterMaxTokens && H <= kc::kMoeRouterMaxHidden) {  // router + routing fused
    kc::moe_router_route_launch(static_cast<const uint16_t*>(x.data), x.stride[0],
                                static_cast<const uint16_t*>(w.router.data), s, w.norm_topk_prob, b, stream);
  } else {
    linear(x, w.router, Tensor(b.logits, DType::bf16, {T, s.E}, x.device));
    kc::moe_route_launch(b.logits, s.E, s, w.norm_topk_prob, b, stream);
  }
  kc::moe_permute_launch(s, b, stream);
  const bool by_caller = experts != MoeExperts::by_rows;  // a caller's explicit kernel (tests, bench) is kept
  if (!by_caller) experts = env_experts();
  if (experts == MoeExperts::by_rows) {
    experts = kc::moe_grouped_gemm_sm90_applies() ? MoeExperts::grouped_gemm_sm90 : MoeExperts::grouped_gemm;
    if (T <= moe_gemv_max_tokens()) experts = MoeExperts::gather_gemv;
  }
  kc::MoeFp8Scales scales;
  if (w.is_fp8()) {  // by rows: the GEMV below the threshold, else W8A8 or a grouped GEMM on the bf16 copy
    if (!by_caller)
      experts = s.fp8_w8a8                                  ? MoeExperts::grouped_gemm_fp8_w8a8
                : !s.fp8_dequant                            ? MoeExperts::gather_gemv
                : env_experts() == MoeExperts::grouped_gemm ? MoeExperts::grouped_gemm
                : kc::moe_grouped_gemm_sm90_applies()       ? MoeExperts::grouped_gemm_sm90
                                                            : MoeExperts::grouped_gemm;
    scales = {.gate_up = w.gate_up_scale.ptr<float>(), .down = w.down_scale.ptr<float>()};
  } else {
    KILN_CHECK(experts != MoeExperts::grouped_gemm_fp8_w8a8,
               "moe_mlp: the W8A8 grouped GEMM takes block-FP8 experts only");
  }
  const kc::MoeExpertKernel kernel =
      experts == MoeExperts::gather_gemv             ? kc::MoeExpertKernel::gather_gemv
      : experts == MoeExperts::grouped_gemm_fp8_w8a8 ? kc::MoeExpertKernel::grouped_gemm_fp8_sm90
      : experts == MoeExperts::grouped_gemm_sm90     ? kc::MoeExpertKernel::grouped_gemm_sm90
                                                     : kc::MoeExpertKernel::grouped_gemm;
  const auto* xp = static_cast<const uint16_t*>(x.data);
  auto* op = static_cast<uint16_t*>(out.data);
  if (kernel == kc::MoeExpertKernel::gather_gemv && T <= kMoeFusedCombineMaxTokens) {
    return kc::moe_experts_combine_launch(xp, x.stride[0], w.gate_up.data, w.down.data, s, b, op,
                                          out.stride[0], stream, scales);
  }
  kc::moe_experts_launch(kernel, xp, x.stride[0], w.gate_up.data, w.down.data, s, b, stream, scales);
  kc::moe_combine_launch(s, b, op, out.stride[0], stream);
}

}  // namespace kiln::ops::cuda
