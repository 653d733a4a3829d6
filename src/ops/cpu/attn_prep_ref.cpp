// CPU reference of ops/attn_prep.h: a direct, scalar transcription of the contract (the oracle).
// Every f32 operation is written out: std::fma for the named fmas, separate statements elsewhere
// (C++20 without GNU extensions compiles with -ffp-contract=off, so nothing else is fused).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/attn_prep.h"
#include "ops/fp8.h"

namespace kiln::ops {

namespace {

struct Act {
  DType t;
  float load(const void* base, int64_t i) const {
    uint16_t b;
    std::memcpy(&b, static_cast<const char*>(base) + i * 2, 2);
    return t == DType::bf16 ? bf16_to_f32(bf16_t{b}) : f16_to_f32(f16_t{b});
  }
  uint16_t bits(const void* base, int64_t i) const {
    uint16_t b;
    std::memcpy(&b, static_cast<const char*>(base) + i * 2, 2);
    return b;
  }
  // act(): round to nearest even, canonical NaN.
  uint16_t round(float v) const { return round_to(t, v); }
  static uint16_t round_to(DType d, float v) {
    if (std::isnan(v)) return 0x7fff;
    return d == DType::bf16 ? f32_to_bf16(v).bits : f32_to_f16(v).bits;
  }
  float widen(uint16_t b) const { return t == DType::bf16 ? bf16_to_f32(bf16_t{b}) : f16_to_f32(f16_t{b}); }
};

void store16(void* base, int64_t i, uint16_t b) {
  std::memcpy(static_cast<char*>(base) + i * 2, &b, 2);
}

int64_t load_index(const Tensor& t, int64_t offset) {
  if (t.dtype == DType::i32) return t.ptr<const int32_t>()[offset];
  return t.ptr<const int64_t>()[offset];
}

int mrope_axis(const MRope& m, int i) {
  if (!m.enabled) return 0;
  const auto& s = m.section;
  if (m.interleaved) {
    if (i % 3 == 1 && i < 3 * s[1]) return 1;
    if (i % 3 == 2 && i < 3 * s[2]) return 2;
    return 0;
  }
  return i < s[0] ? 0 : i < s[0] + s[1] ? 1 : 2;
}

// RMSNorm of one head in the canonical order; returns y (act values, widened).
void rms_norm_head(const Act& act, const float* x, const void* w, int D, float eps, float* y) {
  float p[32];
  for (int l = 0; l < 32; ++l) {
    p[l] = 0.f;
    for (int i = 8 * l; i < 8 * l + 8 && i < D; ++i) p[l] = std::fma(x[i], x[i], p[l]);
  }
  for (int o = 16; o >= 1; o /= 2) {
    float q[32];
    for (int l = 0; l < 32; ++l) q[l] = p[l] + p[l ^ o];
    std::memcpy(p, q, sizeof(p));
  }
  const float ss = p[0];
  const float mean = ss / float(D);
  const float var = mean + eps;
  const float root = std::sqrt(var);
  const float r = 1.0f / root;
  for (int i = 0; i < D; ++i) {
    const float xr = x[i] * r;
    const float n = act.widen(act.round(xr));
    const float nw = n * act.load(w, i);
    y[i] = act.widen(act.round(nw));
  }
}

// RoPE in place on y (act values), then rounding: out = act bits.
void rope_head(const Act& act, const float* y, int D, int R, const float* const* rows, uint16_t* out) {
  const int h = R / 2;
  for (int i = 0; i < h; ++i) {
    const float c = rows[i][i], s = rows[i][h + i];
    const float a = y[i], b = y[i + h];
    const float bs = b * s;
    const float as = a * s;
    out[i] = act.round(std::fma(a, c, -bs));
    out[i + h] = act.round(std::fma(b, c, as));
  }
  for (int i = R; i < D; ++i) out[i] = act.round(y[i]);
}

// Writes one head (act bits) into the cache at (slot, head).
void store_cache_head(const Act& act, const uint16_t* v, int D, const KvCacheView& c, const Tensor& dst,
                      const Tensor& scale, int64_t slot, int head) {
  const int64_t page = slot / c.page_size, row = slot % c.page_size;
  const bool nhd = c.layout == KvLayout::nhd;
  const int64_t off = page * dst.stride[0] + row * dst.stride[nhd ? 1 : 2] + head * dst.stride[nhd ? 2 : 1];
  if (dst.dtype == DType::f8e4m3) {
    const int64_t soff =
        page * scale.stride[0] + row * scale.stride[nhd ? 1 : 2] + head * scale.stride[nhd ? 2 : 1];
    uint8_t* q = dst.ptr<uint8_t>() + off;
    for (int b = 0; b < D / 64; ++b) {
      float a = 0.f;
      for (int i = 64 * b; i < 64 * b + 64; ++i) {
        const float f = std::fabs(act.widen(v[i]));
        if (std::isfinite(f) && f > a) a = f;
      }
      const int e = e4m3_block_exponent(a);
      const float inv = exp2_neg(e);
      for (int i = 64 * b; i < 64 * b + 64; ++i) q[i] = f32_to_e4m3(act.widen(v[i]) * inv);
      scale.ptr<uint8_t>()[soff + b] = ue8m0_from_exponent(e);
    }
    return;
  }
  for (int i = 0; i < D; ++i) {
    uint16_t b = v[i];
    if (dst.dtype != act.t) b = Act::round_to(dst.dtype, act.widen(b));  // bf16 <-> f16: widen, round once
    store16(dst.data, off + i, b);
  }
}

}  // namespace

void attn_prep_reference(const AttnPrepArgs& a) {
  KILN_CHECK(a.qkv.device.is_cpu(), "attn_prep_reference runs on CPU tensors only");
  attn_prep_validate(a);
  const int Hq = a.num_q_heads, Hkv = a.num_kv_heads, D = a.head_dim, R = a.rope.rotary_dim;
  const int64_t T = a.qkv.shape[0];
  const Act act{a.qkv.dtype};
  const int64_t max_pos = a.rope.cos_sin.shape[0];
  const float* table = a.rope.cos_sin.ptr<const float>();
  const int64_t num_slots = a.cache.num_slots();
  std::vector<float> x(D), y(D);
  std::vector<uint16_t> out(D);
  std::vector<const float*> rows(R / 2);

  for (int64_t t = 0; t < T; ++t) {
    // Positions of this token (one per axis) -> the table row each frequency reads.
    int64_t pos[3] = {0, 0, 0};
    for (int ax = 0; ax < (a.mrope.enabled ? 3 : 1); ++ax) {
      const int64_t off = a.mrope.enabled ? ax * a.positions.stride[0] + t * a.positions.stride[1]
                                          : t * a.positions.stride[0];
      pos[ax] = load_index(a.positions, off);
      KILN_CHECK(pos[ax] >= 0 && pos[ax] < max_pos, "position ", pos[ax], " of token ", t,
                 " is outside the rope table [0, ", max_pos, ")");
    }
    for (int i = 0; i < R / 2; ++i) rows[i] = table + pos[mrope_axis(a.mrope, i)] * R;
    const int64_t slot = a.slot_mapping.ptr<const int64_t>()[t * a.slot_mapping.stride[0]];
    KILN_CHECK(slot < num_slots, "slot ", slot, " of token ", t, " is outside the cache (", num_slots,
               " slots)");
    const void* row = static_cast<const char*>(a.qkv.data) + t * a.qkv.stride[0] * 2;

    for (int h = 0; h < Hq + Hkv; ++h) {
      const bool is_q = h < Hq;
      for (int i = 0; i < D; ++i) x[i] = act.load(row, int64_t(h) * D + i);
      if (a.q_norm.data) {
        rms_norm_head(act, x.data(), is_q ? a.q_norm.data : a.k_norm.data, D, a.eps, y.data());
      } else {
        std::copy_n(x.data(), D, y.data());  // no per-head norm: the act values as they are
      }
      rope_head(act, y.data(), D, R, rows.data(), out.data());
      if (is_q) {
        void* dst = a.q_out.data ? a.q_out.data : a.qkv.data;
        const int64_t off = a.q_out.data ? t * a.q_out.stride[0] + h * a.q_out.stride[1]
                                         : t * a.qkv.stride[0] + int64_t(h) * D;
        for (int i = 0; i < D; ++i) store16(dst, off + i, out[i]);
      } else if (slot >= 0) {
        store_cache_head(act, out.data(), D, a.cache, a.cache.k, a.cache.k_scale, slot, h - Hq);
      }
    }
    if (slot >= 0) {
      for (int h = 0; h < Hkv; ++h) {
        for (int i = 0; i < D; ++i) out[i] = act.bits(row, int64_t(Hq + Hkv + h) * D + i);
        store_cache_head(act, out.data(), D, a.cache, a.cache.v, a.cache.v_scale, slot, h);
      }
    }
  }
}

}  // namespace kiln::ops
