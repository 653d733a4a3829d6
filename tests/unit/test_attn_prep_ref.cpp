// CPU reference of attn_prep (src/ops/attn_prep.h) against hand-checked golden vectors, plus validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/attn_prep.h"
#include "ops/fp8.h"

namespace {

using namespace kiln;
using namespace kiln::ops;

uint16_t bf(float f) {
  return f32_to_bf16(f).bits;
}
float fb(uint16_t b) {
  return bf16_to_f32(bf16_t{b});
}

// A tiny layer: Hq = 1, Hkv = 1, D = 8 (R = 8 unless said), one token unless said, bf16 everything.
struct Tiny {
  int T = 1, Hq = 1, Hkv = 1, D = 8, R = 8, page = 2, pages = 3;
  DType cache_dtype = DType::bf16;
  KvLayout layout = KvLayout::nhd;
  std::vector<uint16_t> qkv, qn, kn, q_out;
  std::vector<float> table;  // [max_pos, R]
  std::vector<int32_t> pos;
  std::vector<int64_t> slots;
  std::vector<uint8_t> kc, vc, ks, vs;  // cache bytes (poisoned)

  void init() {
    qkv.assign(size_t(T) * (Hq + 2 * Hkv) * D, bf(0.f));
    qn.assign(D, bf(1.f));
    kn.assign(D, bf(1.f));
    q_out.assign(size_t(T) * Hq * D, 0xdead);
    pos.assign(T, 0);
    slots.assign(T, 0);
    const size_t esz = cache_dtype == DType::f8e4m3 ? 1 : 2;
    kc.assign(size_t(pages) * page * Hkv * D * esz, 0xa5);
    vc = kc;
    ks.assign(size_t(pages) * page * Hkv * (D / 64 ? D / 64 : 1), 0x5a);
    vs = ks;
  }
  void identity_table(int max_pos) {
    table.assign(size_t(max_pos) * R, 0.f);
    for (int p = 0; p < max_pos; ++p)
      for (int i = 0; i < R / 2; ++i) table[p * R + i] = 1.f;
  }
  AttnPrepArgs args(bool q_contiguous = true) {
    AttnPrepArgs a;
    a.qkv = Tensor(qkv.data(), DType::bf16, {T, int64_t(Hq + 2 * Hkv) * D});
    if (q_contiguous) a.q_out = Tensor(q_out.data(), DType::bf16, {T, Hq, D});
    a.q_norm = Tensor(qn.data(), DType::bf16, {D});
    a.k_norm = Tensor(kn.data(), DType::bf16, {D});
    a.eps = 0.f;
    a.positions = Tensor(pos.data(), DType::i32, {T});
    a.rope = RopeTable{Tensor(table.data(), DType::f32, {int64_t(table.size() / R), R}), R};
    a.slot_mapping = Tensor(slots.data(), DType::i64, {T});
    const bool nhd = layout == KvLayout::nhd;
    auto shape4 = [&](void* p, DType t, int64_t last) {
      return nhd ? Tensor(p, t, {pages, page, Hkv, last}) : Tensor(p, t, {pages, Hkv, page, last});
    };
    a.cache.k = shape4(kc.data(), cache_dtype, D);
    a.cache.v = shape4(vc.data(), cache_dtype, D);
    if (cache_dtype == DType::f8e4m3) {
      a.cache.k_scale = shape4(ks.data(), DType::u8, D / 64);
      a.cache.v_scale = shape4(vs.data(), DType::u8, D / 64);
    }
    a.cache.layout = layout;
    a.cache.page_size = page;
    a.num_q_heads = Hq;
    a.num_kv_heads = Hkv;
    a.head_dim = D;
    return a;
  }
  uint16_t cache16(const std::vector<uint8_t>& c, int64_t slot, int head, int d) const {
    const int64_t pg = slot / page, row = slot % page;
    const int64_t idx = layout == KvLayout::nhd ? ((pg * page + row) * Hkv + head) * D + d
                                                : ((pg * Hkv + head) * page + row) * D + d;
    uint16_t b;
    std::memcpy(&b, c.data() + idx * 2, 2);
    return b;
  }
};

TEST(AttnPrepRef, NormAndRopeHandChecked) {
  Tiny k;
  k.init();
  // Q head: x = 2 everywhere -> ss = 32, ss / 8 = 4, sqrt = 2, r = 0.5, n = 1, y = w.
  const float wq[8] = {1, 2, 3, 4, 0.5f, 0.25f, -1, -2};
  for (int i = 0; i < 8; ++i) {
    k.qkv[i] = bf(2.f);
    k.qn[i] = bf(wq[i]);
  }
  // Table row 1: c = {1, 0, 0.5, 0.75}, s = {0, 1, 0.5, 0.25} (exact values, so the result is exact too).
  k.table.assign(2 * 8, 0.f);
  const float row1[8] = {1, 0, 0.5f, 0.75f, 0, 1, 0.5f, 0.25f};
  for (int i = 0; i < 8; ++i) k.table[8 + i] = row1[i];
  k.pos[0] = 1;
  k.slots[0] = 3;  // page 1, row 1
  // K head: x = -3 -> ss = 72, /8 = 9, sqrt = 3, r = f32(1/3); -3 * r rounds to -1 in f32; y = -w = -1.
  for (int i = 0; i < 8; ++i) k.qkv[8 + i] = bf(-3.f);
  // V head: arbitrary bits go to the cache unchanged.
  for (int i = 0; i < 8; ++i) k.qkv[16 + i] = uint16_t(0x3f80 + 17 * i);
  attn_prep_reference(k.args());
  // o_i = y_i c_i - y_{i+4} s_i;  o_{i+4} = y_{i+4} c_i + y_i s_i
  const float want_q[8] = {1, -0.25f, 2, 3.5f, 0.5f, 2, 1, -0.5f};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(fb(k.q_out[i]), want_q[i]) << i;
  // K: y = -1 everywhere -> o_i = -c_i + s_i, o_{i+4} = -c_i - s_i.
  const float want_k[8] = {-1, 1, 0, -0.5f, -1, -1, -1, -1};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(fb(k.cache16(k.kc, 3, 0, i)), want_k[i]) << i;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(k.cache16(k.vc, 3, 0, i), uint16_t(0x3f80 + 17 * i));
  // Q input untouched (q went out contiguous); every other cache slot untouched.
  for (int i = 0; i < 8; ++i) EXPECT_EQ(k.qkv[i], bf(2.f));
  for (int s = 0; s < k.pages * k.page; ++s) {
    if (s == 3) continue;
    for (int i = 0; i < 8; ++i) EXPECT_EQ(k.cache16(k.kc, s, 0, i), 0xa5a5) << s;
  }
}

// Without norm weights (a Llama attention: the EAGLE-3 draft's midlayer) step 1 passes the values through:
// the hand-checked case above with x in place of the normed y; one weight alone is an error.
TEST(AttnPrepRef, NoPerHeadNorm) {
  Tiny k;
  k.init();
  k.table.assign(2 * 8, 0.f);
  const float row1[8] = {1, 0, 0.5f, 0.75f, 0, 1, 0.5f, 0.25f};
  for (int i = 0; i < 8; ++i) k.table[8 + i] = row1[i];
  k.pos[0] = 1;
  k.slots[0] = 3;
  const float xq[8] = {1, 2, 3, 4, 0.5f, 0.25f, -1, -2};
  for (int i = 0; i < 8; ++i) {
    k.qkv[i] = bf(xq[i]);
    k.qkv[8 + i] = bf(-1.f);
  }
  AttnPrepArgs a = k.args();
  a.q_norm = Tensor();
  a.k_norm = Tensor();
  attn_prep_reference(a);
  const float want_q[8] = {1, -0.25f, 2, 3.5f, 0.5f, 2, 1, -0.5f};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(fb(k.q_out[i]), want_q[i]) << i;
  const float want_k[8] = {-1, 1, 0, -0.5f, -1, -1, -1, -1};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(fb(k.cache16(k.kc, 3, 0, i)), want_k[i]) << i;
  a.k_norm = Tensor(k.kn.data(), DType::bf16, {8});
  EXPECT_THROW(attn_prep_reference(a), Error);
}

TEST(AttnPrepRef, EpsAndDoubleRounding) {
  Tiny k;
  k.init();
  k.identity_table(1);
  for (int i = 0; i < 8; ++i) k.qkv[i] = bf(2.f);
  // ss / 8 = 4, + eps 5 = 9, sqrt 3, r = f32(1/3); 2 * r = 0.6666667 -> bf16 0.66796875 (1.0101011b * 2^-1).
  AttnPrepArgs a = k.args();
  a.eps = 5.f;
  attn_prep_reference(a);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(fb(k.q_out[i]), 0.66796875f);
  // Weight 3: n * w = 2.00390625 is exact in f32; a quarter of a bf16 ulp above 2, it rounds to 2.0.
  for (int i = 0; i < 8; ++i) k.qn[i] = bf(3.f);
  attn_prep_reference(a);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(fb(k.q_out[i]), 2.0f);
}

TEST(AttnPrepRef, InPlacePartialRotaryAndSkippedSlot) {
  Tiny k;
  k.R = 4;  // rotate elements 0..3 only (pairs (0,2), (1,3)); 4..7 pass through
  k.init();
  k.table = {0, 0, 1, 1};  // row 0: c = 0, s = 1: o_i = -y_{i+2}, o_{i+2} = y_i
  for (int i = 0; i < 8; ++i) k.qkv[i] = bf(2.f);
  const float wq[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int i = 0; i < 8; ++i) k.qn[i] = bf(wq[i]);
  for (int i = 8; i < 24; ++i) k.qkv[i] = bf(7.f);
  k.slots[0] = -1;
  attn_prep_reference(k.args(/*q_contiguous=*/false));
  const float want[8] = {-3, -4, 1, 2, 5, 6, 7, 8};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(fb(k.qkv[i]), want[i]) << i;
  for (int i = 8; i < 24; ++i) EXPECT_EQ(k.qkv[i], bf(7.f)) << "K and V columns never written";
  for (uint8_t b : k.kc) EXPECT_EQ(b, 0xa5);
  for (uint8_t b : k.vc) EXPECT_EQ(b, 0xa5);
  for (uint16_t b : k.q_out) EXPECT_EQ(b, 0xdead);
}

TEST(AttnPrepRef, HndLayoutAndTwoTokens) {
  Tiny k;
  k.T = 2;
  k.Hkv = 2;
  k.Hq = 2;
  k.layout = KvLayout::hnd;
  k.init();
  k.identity_table(4);
  // Token t, V head h: value 10 * t + h + 1 (bf16 exact); slots 4 and 1.
  const int W = (k.Hq + 2 * k.Hkv) * k.D;
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 8; ++i) k.qkv[t * W + (k.Hq + k.Hkv + h) * 8 + i] = bf(float(10 * t + h + 1));
  k.slots = {4, 1};
  attn_prep_reference(k.args());
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 8; ++i)
        EXPECT_EQ(fb(k.cache16(k.vc, k.slots[t], h, i)), float(10 * t + h + 1)) << t << " " << h;
  // HND: slot 4 (page 2, row 0) of head 1 sits at ((2 * 2 + 1) * 2 + 0) * 8 elements.
  uint16_t b;
  std::memcpy(&b, k.vc.data() + ((2 * 2 + 1) * 2 + 0) * 8 * 2, 2);
  EXPECT_EQ(fb(b), 2.f);
}

TEST(AttnPrepRef, MRopeAxisMaps) {
  // Table rows: 0 identity (c 1, s 0), 1 quarter turn (c 0, s 1), 2 negation (c -1, s 0). Positions
  // (t, h, w) = (0, 1, 2), so each frequency's output shows which axis it read.
  for (bool interleaved : {false, true}) {
    Tiny k;
    k.D = 16;
    k.R = 16;
    k.init();
    k.table.assign(3 * 16, 0.f);
    for (int i = 0; i < 8; ++i) {
      k.table[0 * 16 + i] = 1.f;
      k.table[1 * 16 + 8 + i] = 1.f;
      k.table[2 * 16 + i] = -1.f;
    }
    std::vector<int64_t> pos3 = {0, 1, 2};
    for (int i = 0; i < 16; ++i) k.qkv[i] = bf(1.f);  // x = 1: ss = 16, r = 1, n = 1
    for (int i = 0; i < 16; ++i) k.qn[i] = bf(float(i + 1));
    AttnPrepArgs a = k.args();
    a.positions = Tensor::strided(pos3.data(), DType::i64, {3, 1}, {1, 1});
    a.mrope = MRope{{2, 3, 3}, true, interleaved};
    attn_prep_reference(a);
    const int want_sectioned[8] = {0, 0, 1, 1, 1, 2, 2, 2};
    const int want_interleaved[8] = {0, 1, 2, 0, 1, 2, 0, 1};
    for (int i = 0; i < 8; ++i) {
      const float y0 = float(i + 1), y1 = float(i + 9);
      const int ax = interleaved ? want_interleaved[i] : want_sectioned[i];
      const float w0 = ax == 0 ? y0 : ax == 1 ? -y1 : -y0;
      const float w1 = ax == 0 ? y1 : ax == 1 ? y0 : -y1;
      EXPECT_EQ(fb(k.q_out[i]), w0) << "frequency " << i << (interleaved ? " interleaved" : " sectioned");
      EXPECT_EQ(fb(k.q_out[i + 8]), w1) << "frequency " << i;
    }
  }
}

TEST(AttnPrepRef, Fp8CacheBlock) {
  Tiny k;
  k.D = 64;
  k.R = 64;
  k.cache_dtype = DType::f8e4m3;
  k.init();
  k.identity_table(1);
  for (int i = 0; i < 64; ++i) k.qkv[i] = bf(1.f);
  for (int i = 64; i < 128; ++i) k.qkv[i] = bf(1.f);
  // V block: max |v| = 448 (e = 0, scale byte 127) with rounding edges inside.
  uint16_t* v = k.qkv.data() + 128;
  const float vals[] = {448,           -448,    0,       0.001953125f, 0.0009765625f,
                        0.0029296875f, 1.0625f, 1.1875f, 240,          -0.f};
  const uint8_t want[] = {0x7e, 0xfe, 0x00, 0x01, 0x00, 0x02, 0x38, 0x3a, 0x77, 0x80};
  for (int i = 0; i < 64; ++i) v[i] = bf(0.f);
  for (int i = 0; i < 10; ++i) v[i] = bf(vals[i]);
  v[10] = 0x7f80;  // +Inf: ignored by the max, saturates to 448
  v[11] = 0xffc1;  // NaN: ignored by the max, stored as 0x7f
  k.slots[0] = 0;
  attn_prep_reference(k.args());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(k.vc[i], want[i]) << i;
  EXPECT_EQ(k.vc[10], 0x7e);
  EXPECT_EQ(k.vc[11], 0x7f);
  EXPECT_EQ(k.vs[0], 127);
  // K: x = 1, w = 1 -> y = 1 (identity rope): a = 1, e = -8, scale byte 119, 1 * 2^8 = 256 -> 0x78.
  for (int i = 0; i < 64; ++i) EXPECT_EQ(k.kc[i], 0x78) << i;
  EXPECT_EQ(k.ks[0], 119);
  // A block of 450: e = 1 (byte 128), 225 -> 224 = 0x76. A zero block: byte 127, zeros.
  for (int i = 0; i < 64; ++i) v[i] = bf(i == 5 ? 450.f : 0.f);
  k.slots[0] = 1;
  attn_prep_reference(k.args());
  EXPECT_EQ(k.vs[1], 128);
  EXPECT_EQ(k.vc[64 + 5], 0x76);
  for (int i = 0; i < 64; ++i) v[i] = bf(0.f);
  k.slots[0] = 2;
  attn_prep_reference(k.args());
  EXPECT_EQ(k.vs[2], 127);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(k.vc[128 + i], 0);
  EXPECT_EQ(k.vs[3], 0x5a) << "untouched scale";
}

TEST(AttnPrepRef, ValidationErrors) {
  Tiny k;
  k.init();
  k.identity_table(2);
  AttnPrepArgs a = k.args();
  EXPECT_NO_THROW(attn_prep_reference(a));
  AttnPrepArgs b = a;
  b.head_dim = 12;
  EXPECT_THROW(attn_prep_reference(b), Error);
  b = a;
  b.qkv.dtype = DType::f32;
  EXPECT_THROW(attn_prep_reference(b), Error);
  b = a;
  b.rope.rotary_dim = 3;
  EXPECT_THROW(attn_prep_reference(b), Error);
  b = a;
  b.cache.page_size = 3;
  EXPECT_THROW(attn_prep_reference(b), Error);
  b = a;
  b.mrope.enabled = true;  // positions are [T], not [3, T]
  EXPECT_THROW(attn_prep_reference(b), Error);
  k.pos[0] = 2;  // outside the 2-row table
  EXPECT_THROW(attn_prep_reference(a), Error);
  k.pos[0] = 0;
  k.slots[0] = 6;  // 3 pages of 2
  EXPECT_THROW(attn_prep_reference(a), Error);
  k.slots[0] = -5;  // skipped, fine
  EXPECT_NO_THROW(attn_prep_reference(a));
  // T = 0: valid, nothing written.
  AttnPrepArgs z = a;
  z.qkv.shape[0] = 0;
  z.q_out.shape[0] = 0;
  z.positions.shape[0] = 0;
  z.slot_mapping.shape[0] = 0;
  EXPECT_NO_THROW(attn_prep_reference(z));
}

TEST(AttnPrepRef, RopeTableValues) {
  Buffer t = build_rope_table(8, 10000.0, 5, Device::cpu());
  const float* p = static_cast<const float*>(t.data());
  EXPECT_EQ(p[0 * 8 + 0], 1.f);
  EXPECT_EQ(p[0 * 8 + 4], 0.f);
  EXPECT_EQ(p[3 * 8 + 0], float(std::cos(3.0)));
  EXPECT_EQ(p[3 * 8 + 4], float(std::sin(3.0)));
  EXPECT_EQ(p[2 * 8 + 1], float(std::cos(2.0 * std::pow(10000.0, -0.25))));
  EXPECT_THROW(build_rope_table(7, 10000.0, 5, Device::cpu()), Error);
}

}  // namespace
