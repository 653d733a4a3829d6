// attn_prep dispatcher: validation (once, here), the guards that pick the fused kernels, and the fallback.
#include "ops/attn_prep.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "ops/cuda/attn_prep_params.h"
#ifdef KILN_HAVE_CUDA
#include "ops/cuda/context.h"
#endif

namespace kiln::ops {

namespace {

bool is_act(DType t) {
  return t == DType::bf16 || t == DType::f16;
}
bool is_cache(DType t) {
  return t == DType::bf16 || t == DType::f16 || t == DType::f8e4m3;
}

void check_same_device(const Tensor& t, Device d, const char* name) {
  KILN_CHECK(t.device == d, name, " is on ", device_name(t.device), " but qkv is on ", device_name(d));
}

void check_cache_tensor(const Tensor& x, const char* name, const KvCacheView& c, int Hkv, int64_t last) {
  KILN_CHECK_EQ(x.ndim, 4, name, " must be 4-d, got ", x.describe());
  KILN_CHECK_EQ(x.stride[3], int64_t(1), name, " last dim must be contiguous");
  const bool nhd = c.layout == KvLayout::nhd;
  KILN_CHECK_EQ(x.shape[nhd ? 1 : 2], int64_t(c.page_size), name, " page_size dim of ", x.describe());
  KILN_CHECK_EQ(x.shape[nhd ? 2 : 1], int64_t(Hkv), name, " kv-head dim of ", x.describe());
  KILN_CHECK_EQ(x.shape[3], last, name, " last dim of ", x.describe());
  KILN_CHECK(x.data != nullptr || x.numel() == 0, name, " has no data");
}

}  // namespace

const char* attn_prep_path_name(AttnPrepPath p) {
  switch (p) {
    case AttnPrepPath::cpu_reference:
      return "cpu_reference";
    case AttnPrepPath::cuda_fused_decode:
      return "cuda_fused_decode";
    case AttnPrepPath::cuda_fused_prefill:
      return "cuda_fused_prefill";
    case AttnPrepPath::cuda_fused_streaming:
      return "cuda_fused_streaming";
    case AttnPrepPath::cuda_unfused:
      return "cuda_unfused";
    case AttnPrepPath::cuda_gemv_fused:
      return "cuda_gemv_fused";
  }
  return "?";
}

void attn_prep_validate(const AttnPrepArgs& a) {
  const int Hq = a.num_q_heads, Hkv = a.num_kv_heads, D = a.head_dim;
  KILN_CHECK(Hq > 0 && Hkv > 0, "head counts must be positive: ", Hq, "/", Hkv);
  KILN_CHECK(D >= 8 && D <= 256 && D % 8 == 0, "head_dim must be a multiple of 8 in [8, 256], got ", D);
  const Tensor& x = a.qkv;
  KILN_CHECK_EQ(x.ndim, 2, "qkv must be [T, (Hq + 2*Hkv) * D], got ", x.describe());
  KILN_CHECK(is_act(x.dtype), "qkv must be bf16 or f16, got ", x.describe());
  KILN_CHECK_EQ(x.shape[1], int64_t(Hq + 2 * Hkv) * D, "qkv width for Hq=", Hq, " Hkv=", Hkv, " D=", D);
  KILN_CHECK_EQ(x.stride[1], int64_t(1), "qkv columns must be contiguous");
  const int64_t T = x.shape[0];
  KILN_CHECK(T >= 0 && T <= (int64_t(1) << 30), "bad token count ", T);
  KILN_CHECK(T <= 1 || x.stride[0] >= x.shape[1], "qkv row stride ", x.stride[0], " overlaps rows");
  const Device dev = x.device;

  if (a.q_out.data != nullptr) {
    const Tensor& q = a.q_out;
    KILN_CHECK(q.ndim == 3 && q.shape[0] == T && q.shape[1] == Hq && q.shape[2] == D,
               "q_out must be [T, Hq, D] = [", T, ", ", Hq, ", ", D, "], got ", q.describe());
    KILN_CHECK(q.dtype == x.dtype, "q_out dtype ", dtype_name(q.dtype), " must equal qkv's ",
               dtype_name(x.dtype));
    KILN_CHECK_EQ(q.stride[2], int64_t(1), "q_out last dim must be contiguous");
    check_same_device(q, dev, "q_out");
  }
  KILN_CHECK((a.q_norm.data == nullptr) == (a.k_norm.data == nullptr),
             "q_norm and k_norm must both be given or both be empty (no per-head norm)");
  for (const Tensor* w : {&a.q_norm, &a.k_norm}) {
    if (w->data == nullptr) continue;
    KILN_CHECK(w->ndim == 1 && w->shape[0] == D && w->stride[0] == 1 && w->data,
               "q_norm / k_norm must be contiguous [D] = [", D, "], got ", w->describe());
    KILN_CHECK(w->dtype == x.dtype, "norm weight dtype ", dtype_name(w->dtype), " must equal qkv's");
    check_same_device(*w, dev, "norm weight");
  }
  KILN_CHECK(std::isfinite(a.eps) && a.eps >= 0.f, "eps must be finite and >= 0, got ", a.eps);

  const Tensor& p = a.positions;
  KILN_CHECK(p.dtype == DType::i32 || p.dtype == DType::i64, "positions must be i32 or i64, got ",
             p.describe());
  if (a.mrope.enabled) {
    KILN_CHECK(p.ndim == 2 && p.shape[0] == 3 && p.shape[1] == T, "M-RoPE positions must be [3, T], got ",
               p.describe());
    const auto& s = a.mrope.section;
    KILN_CHECK(s[0] >= 0 && s[1] >= 0 && s[2] >= 0 && s[0] + s[1] + s[2] == a.rope.rotary_dim / 2,
               "mrope section {", s[0], ", ", s[1], ", ", s[2],
               "} must sum to rotary_dim / 2 = ", a.rope.rotary_dim / 2);
  } else {
    KILN_CHECK(p.ndim == 1 && p.shape[0] == T, "positions must be [T] (M-RoPE off), got ", p.describe());
  }
  KILN_CHECK(T == 0 || p.data, "positions has no data");
  check_same_device(p, dev, "positions");

  const Tensor& tab = a.rope.cos_sin;
  const int R = a.rope.rotary_dim;
  KILN_CHECK(R >= 2 && R % 2 == 0 && R <= D, "rotary_dim must be even in [2, head_dim], got ", R);
  KILN_CHECK(tab.ndim == 2 && tab.dtype == DType::f32 && tab.shape[1] == R && tab.shape[0] > 0 &&
                 tab.is_contiguous() && tab.data,
             "rope table must be contiguous f32 [max_pos, rotary_dim], got ", tab.describe());
  check_same_device(tab, dev, "rope table");

  const Tensor& sm = a.slot_mapping;
  KILN_CHECK(sm.ndim == 1 && sm.shape[0] == T && sm.dtype == DType::i64 && (T == 0 || sm.data),
             "slot_mapping must be i64 [T], got ", sm.describe());
  check_same_device(sm, dev, "slot_mapping");

  const KvCacheView& c = a.cache;
  KILN_CHECK(c.page_size > 0, "page_size must be positive, got ", c.page_size);
  KILN_CHECK(is_cache(c.k.dtype), "cache dtype must be bf16, f16 or f8e4m3, got ", c.k.describe());
  KILN_CHECK(c.k.dtype == c.v.dtype, "k and v caches must share a dtype");
  check_cache_tensor(c.k, "cache.k", c, Hkv, D);
  check_cache_tensor(c.v, "cache.v", c, Hkv, D);
  KILN_CHECK(c.k.shape == c.v.shape && c.k.stride == c.v.stride,
             "k and v caches must share shape and strides");
  check_same_device(c.k, dev, "cache.k");
  check_same_device(c.v, dev, "cache.v");
  if (c.k.dtype == DType::f8e4m3) {
    KILN_CHECK(D % 64 == 0, "an f8e4m3 cache needs head_dim % 64 == 0, got ", D);
    for (const Tensor* s : {&c.k_scale, &c.v_scale}) {
      KILN_CHECK(s->dtype == DType::u8, "fp8 cache scales must be u8 (UE8M0), got ", s->describe());
      check_cache_tensor(*s, "cache scale", c, Hkv, D / 64);
      KILN_CHECK_EQ(s->shape[0], c.k.shape[0], "scale pages");
      check_same_device(*s, dev, "cache scale");
    }
    KILN_CHECK(c.k_scale.stride == c.v_scale.stride, "k and v scales must share strides");
  } else {
    KILN_CHECK(c.k_scale.data == nullptr && c.v_scale.data == nullptr, "scales are only for an f8e4m3 cache");
  }
}

namespace {

[[maybe_unused]] cuda::AttnPrepParams make_params(const AttnPrepArgs& a) {
  cuda::AttnPrepParams p;
  p.T = int(a.qkv.shape[0]);
  p.Hq = a.num_q_heads;
  p.Hkv = a.num_kv_heads;
  p.D = a.head_dim;
  p.rotary_dim = a.rope.rotary_dim;
  p.act = a.qkv.dtype == DType::bf16 ? cuda::ActKind::bf16 : cuda::ActKind::f16;
  const DType cd = a.cache.k.dtype;
  p.cache = cd == DType::bf16  ? cuda::CacheKind::bf16
            : cd == DType::f16 ? cuda::CacheKind::f16
                               : cuda::CacheKind::fp8;
  p.qkv = a.qkv.data;
  p.qkv_row = a.qkv.stride[0];
  if (a.q_out.data) {
    p.q_dst = a.q_out.data;
    p.q_row = a.q_out.stride[0];
    p.q_head = a.q_out.stride[1];
  } else {
    p.q_dst = a.qkv.data;
    p.q_row = a.qkv.stride[0];
    p.q_head = a.head_dim;
  }
  p.pdl = a.pdl;
  p.q_norm = a.q_norm.data;
  p.k_norm = a.k_norm.data;
  p.eps = a.eps;
  p.pos = a.positions.data;
  p.pos_i64 = a.positions.dtype == DType::i64;
  if (a.mrope.enabled) {
    p.pos_axis = a.positions.stride[0];
    p.pos_t = a.positions.stride[1];
    p.mrope = a.mrope.interleaved ? cuda::MRopeMode::interleaved : cuda::MRopeMode::sectioned;
    for (int i = 0; i < 3; ++i) p.section[i] = a.mrope.section[i];
  } else {
    p.pos_axis = 0;
    p.pos_t = a.positions.stride[0];
  }
  p.rope = a.rope.cos_sin.ptr<const float>();
  p.max_pos = a.rope.cos_sin.shape[0];
  p.slots = a.slot_mapping.ptr<const int64_t>();
  p.slot_stride = a.slot_mapping.stride[0];
  p.num_slots = a.cache.num_slots();
  p.page_size = a.cache.page_size;
  const bool nhd = a.cache.layout == KvLayout::nhd;
  p.k_cache = a.cache.k.data;
  p.v_cache = a.cache.v.data;
  p.c_page = a.cache.k.stride[0];
  p.c_row = a.cache.k.stride[nhd ? 1 : 2];
  p.c_head = a.cache.k.stride[nhd ? 2 : 1];
  if (p.cache == cuda::CacheKind::fp8) {
    p.k_scale = a.cache.k_scale.ptr<uint8_t>();
    p.v_scale = a.cache.v_scale.ptr<uint8_t>();
    p.s_page = a.cache.k_scale.stride[0];
    p.s_row = a.cache.k_scale.stride[nhd ? 1 : 2];
    p.s_head = a.cache.k_scale.stride[nhd ? 2 : 1];
  }
  return p;
}

// Rows up to this many tokens take the small-batch (latency) kernel; above, a prefill kernel.
constexpr int64_t kDecodeMaxTokens = 128;
// Up to this many tokens the cp.async streaming kernel (where its head-count guard holds), above it the
// register-load prefill kernel. H200, Qwen3-4B heads (docs/PERF.md): streaming 9.8 vs 11.7 us at T = 512,
// prefill 41.1 vs 43.4 us at T = 4096; the threshold sits between the two measured points.
constexpr int64_t kStreamingMaxTokens = 1024;

}  // namespace

bool attn_prep_unfused_forced() {
  static const bool forced = [] {
    const char* e = std::getenv("KILN_ATTN_PREP");
    if (!e || !*e) return false;
    const std::string v(e);
    KILN_CHECK(v == "fused" || v == "unfused", "KILN_ATTN_PREP must be fused or unfused, got '", v, "'");
    return v == "unfused";
  }();
  return forced;
}

AttnPrepPath attn_prep_select(const AttnPrepArgs& a) {
  if (a.qkv.device.is_cpu()) return AttnPrepPath::cpu_reference;
#ifdef KILN_HAVE_CUDA
  // Without per-head norms only the unfused kernels apply (their norm step copies).
  if (attn_prep_unfused_forced() || a.q_norm.data == nullptr) return AttnPrepPath::cuda_unfused;
  const cuda::AttnPrepParams p = make_params(a);
  if (cuda::attn_prep_fused_supported(p)) {
    if (a.qkv.shape[0] <= kDecodeMaxTokens) return AttnPrepPath::cuda_fused_decode;
    return a.qkv.shape[0] <= kStreamingMaxTokens && cuda::attn_prep_streaming_supported(p)
               ? AttnPrepPath::cuda_fused_streaming
               : AttnPrepPath::cuda_fused_prefill;
  }
#endif
  return AttnPrepPath::cuda_unfused;
}

AttnPrepPath attn_prep(const AttnPrepArgs& a) {
  attn_prep_validate(a);
  const AttnPrepPath path = attn_prep_select(a);
  if (path == AttnPrepPath::cpu_reference) {
    attn_prep_reference(a);
    return path;
  }
#ifdef KILN_HAVE_CUDA
  if (a.qkv.shape[0] == 0) return path;
  cuda::AttnPrepParams p = make_params(a);
  // Inside the decode graphs (pdl_enabled) the fused kernels launch with PDL too: they wait before reading.
  p.pdl = p.pdl || cuda::pdl_for(cuda::PdlSite::elementwise);
  if (path == AttnPrepPath::cuda_unfused) {
    cuda::launch_attn_prep_unfused(p, a.stream);
  } else {
    const cuda::FusedKernel k = path == AttnPrepPath::cuda_fused_decode    ? cuda::FusedKernel::decode
                                : path == AttnPrepPath::cuda_fused_prefill ? cuda::FusedKernel::prefill
                                                                           : cuda::FusedKernel::streaming;
    cuda::launch_attn_prep_fused(p, k, a.stream);
  }
  return path;
#else
  KILN_FAIL("kiln was built without CUDA: attn_prep on ", device_name(a.qkv.device));
#endif
}

void attn_prep_unfused(const AttnPrepArgs& a) {
  attn_prep_validate(a);
  KILN_CHECK(a.qkv.device.is_cuda(), "attn_prep_unfused runs on CUDA tensors only");
#ifdef KILN_HAVE_CUDA
  if (a.qkv.shape[0] == 0) return;
  cuda::launch_attn_prep_unfused(make_params(a), a.stream);
#endif
}

void attn_prep_fused(const AttnPrepArgs& a, AttnPrepKernel kernel) {
  attn_prep_validate(a);
  KILN_CHECK(a.qkv.device.is_cuda(), "attn_prep_fused runs on CUDA tensors only");
  KILN_CHECK(a.q_norm.data != nullptr, "attn_prep_fused: the fused kernels need the per-head norm weights");
#ifdef KILN_HAVE_CUDA
  const cuda::AttnPrepParams p = make_params(a);
  KILN_CHECK(cuda::attn_prep_fused_supported(p), "the fused attn_prep kernel does not cover head_dim ", p.D,
             " / rotary_dim ", p.rotary_dim, " / these alignments");
  if (p.T == 0) return;
  static_assert(int(AttnPrepKernel::prefill_streaming) == int(cuda::FusedKernel::streaming));
  cuda::launch_attn_prep_fused(p, static_cast<cuda::FusedKernel>(kernel), a.stream);
#else
  (void)kernel;
#endif
}

}  // namespace kiln::ops

namespace kiln::ops {

cuda::AttnPrepParams attn_prep_params(const AttnPrepArgs& a) {
  attn_prep_validate(a);
  return make_params(a);
}

}  // namespace kiln::ops
