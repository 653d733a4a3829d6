// CPU paged attention: hand-checked cases, an fp64 reference on a mixed batch (prefill over a cached
// prefix, fresh prefill, decode), bitwise invariance over page size and layout, and fp8 / f16 caches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "ops/attention.h"
#include "ops/fp8.h"

using namespace kiln;
using ops::KvLayout;

namespace {

float f(bf16_t x) {
  return bf16_to_f32(x);
}

// Logical K/V values [seq][pos][Hkv][D] (fp32, representable in the cache dtype), placed into a paged
// cache with a shuffled page assignment.
struct Problem {
  int64_t Hq = 8, Hkv = 2, D = 64;
  std::vector<int32_t> q_lens, kv_lens;
  std::vector<std::vector<float>> k, v;  // per sequence [kv_len, Hkv, D]
  std::vector<bf16_t> q;                 // [T, Hq, D]
  int64_t T() const { return std::accumulate(q_lens.begin(), q_lens.end(), int64_t(0)); }
};

Problem make_problem(std::vector<int32_t> q_lens, std::vector<int32_t> kv_lens, DType dt, uint32_t seed,
                     int64_t D = 64) {
  Problem p;
  p.D = D;
  p.q_lens = std::move(q_lens);
  p.kv_lens = std::move(kv_lens);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.5f, 1.5f);
  auto representable = [&](float x) {
    if (dt == DType::f16) return f16_to_f32(f32_to_f16(x));
    if (dt == DType::f8e4m3) return e4m3_to_f32(f32_to_e4m3(x * 64.0f)) / 64.0f;  // code * 2^-6
    return bf16_to_f32(f32_to_bf16(x));
  };
  for (size_t b = 0; b < p.kv_lens.size(); ++b) {
    std::vector<float> k(size_t(p.kv_lens[b] * p.Hkv * p.D)), v(k.size());
    for (auto& x : k) x = representable(d(rng));
    for (auto& x : v) x = representable(d(rng));
    p.k.push_back(std::move(k));
    p.v.push_back(std::move(v));
  }
  p.q.resize(size_t(p.T() * p.Hq * p.D));
  for (auto& x : p.q) x = f32_to_bf16(d(rng));
  return p;
}

struct Cache {
  std::vector<uint8_t> k, v, ks, vs;  // raw bytes
  ops::KvCacheView view;
  std::vector<int32_t> page_table;
  int64_t pages_stride = 0;
};

// Writes the problem into a cache of the given layout, page size and dtype. fp8 values were drawn as
// e4m3 codes times 2^-6, so every scale byte is 127 - 6.
Cache build_cache(const Problem& p, KvLayout layout, int page_size, DType dt, uint32_t seed) {
  Cache c;
  const int64_t B = int64_t(p.kv_lens.size());
  int64_t max_pages = 0, total = 0;
  for (int32_t l : p.kv_lens) {
    max_pages = std::max<int64_t>(max_pages, (l + page_size - 1) / page_size);
    total += (l + page_size - 1) / page_size;
  }
  const int64_t num_pages = total + 3;  // a few unused pages
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  c.pages_stride = max_pages + 1;
  c.page_table.assign(size_t(B * c.pages_stride), 0);
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < (p.kv_lens[b] + page_size - 1) / page_size; ++i)
      c.page_table[size_t(b * c.pages_stride + i)] = perm[size_t(next++)];
  const int64_t es = dtype_size(dt);
  const int64_t n = num_pages * page_size * p.Hkv * p.D;
  c.k.assign(size_t(n * es), 0xff);  // garbage (NaN patterns) where nothing is written
  c.v.assign(size_t(n * es), 0xff);
  auto make = [&](void* data, DType t, int64_t last) {
    return layout == KvLayout::nhd ? Tensor(data, t, {num_pages, page_size, p.Hkv, last})
                                   : Tensor(data, t, {num_pages, p.Hkv, page_size, last});
  };
  c.view.layout = layout;
  c.view.page_size = page_size;
  c.view.k = make(c.k.data(), dt, p.D);
  c.view.v = make(c.v.data(), dt, p.D);
  if (dt == DType::f8e4m3) {
    c.ks.assign(size_t(n / 64), 127 - 6);
    c.vs.assign(size_t(n / 64), 127 - 6);
    c.view.k_scale = make(c.ks.data(), DType::u8, p.D / 64);
    c.view.v_scale = make(c.vs.data(), DType::u8, p.D / 64);
  }
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < p.kv_lens[b]; ++j) {
      const int64_t page = c.page_table[size_t(b * c.pages_stride + j / page_size)], row = j % page_size;
      for (int64_t h = 0; h < p.Hkv; ++h) {
        const int64_t base = layout == KvLayout::nhd ? ((page * page_size + row) * p.Hkv + h) * p.D
                                                     : ((page * p.Hkv + h) * page_size + row) * p.D;
        for (int64_t d = 0; d < p.D; ++d) {
          const size_t src = size_t((j * p.Hkv + h) * p.D + d);
          for (int kv = 0; kv < 2; ++kv) {
            const float x = (kv ? p.v : p.k)[size_t(b)][src];
            uint8_t* dst = (kv ? c.v : c.k).data() + (base + d) * es;
            if (dt == DType::bf16) {
              const bf16_t h16 = f32_to_bf16(x);
              std::memcpy(dst, &h16, 2);
            } else if (dt == DType::f16) {
              const f16_t h16 = f32_to_f16(x);
              std::memcpy(dst, &h16, 2);
            } else {
              *dst = f32_to_e4m3(x * 64.0f);
            }
          }
        }
      }
    }
  }
  return c;
}

std::vector<bf16_t> run(const Problem& p, const Cache& c) {
  const int64_t T = p.T(), B = int64_t(p.kv_lens.size());
  std::vector<int32_t> cu(size_t(B + 1), 0);
  for (int64_t b = 0; b < B; ++b) cu[size_t(b + 1)] = cu[size_t(b)] + p.q_lens[size_t(b)];
  std::vector<int32_t> kv = p.kv_lens;
  std::vector<bf16_t> out(size_t(T * p.Hq * p.D));
  ops::PagedAttentionArgs a;
  a.q = Tensor(const_cast<bf16_t*>(p.q.data()), DType::bf16, {T, p.Hq, p.D});
  a.cache = c.view;
  a.cu_q = Tensor(cu.data(), DType::i32, {B + 1});
  a.kv_lens = Tensor(kv.data(), DType::i32, {B});
  a.page_table = Tensor(const_cast<int32_t*>(c.page_table.data()), DType::i32, {B, c.pages_stride});
  a.out = Tensor(out.data(), DType::bf16, {T, p.Hq, p.D});
  a.scale = 1.0f / std::sqrt(float(p.D));
  ops::paged_attention(a);
  return out;
}

// fp64 reference from the logical values; returns the relative Frobenius error of `got`.
double reference_error(const Problem& p, const std::vector<bf16_t>& got) {
  double num = 0, den = 0;
  int64_t t = 0;
  const double scale = 1.0 / std::sqrt(double(p.D));
  for (size_t b = 0; b < p.kv_lens.size(); ++b) {
    for (int32_t i = 0; i < p.q_lens[b]; ++i, ++t) {
      const int64_t pos = p.kv_lens[b] - p.q_lens[b] + i;
      for (int64_t h = 0; h < p.Hq; ++h) {
        const int64_t hk = h / (p.Hq / p.Hkv);
        std::vector<double> s(size_t(pos + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= pos; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < p.D; ++d)
            dot +=
                double(f(p.q[size_t((t * p.Hq + h) * p.D + d)])) * p.k[b][size_t((j * p.Hkv + hk) * p.D + d)];
          s[size_t(j)] = dot * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < p.D; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= pos; ++j) o += s[size_t(j)] * p.v[b][size_t((j * p.Hkv + hk) * p.D + d)];
          o /= sum;
          const double g = f(got[size_t((t * p.Hq + h) * p.D + d)]);
          num += (g - o) * (g - o);
          den += o * o;
        }
      }
    }
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST(OpsPagedAttention, SingleTokenReturnsV) {
  // One context token: softmax weight 1, so the output is V rounded to bf16.
  Problem p = make_problem({1}, {1}, DType::bf16, 1);
  const Cache c = build_cache(p, KvLayout::nhd, 16, DType::bf16, 1);
  const auto out = run(p, c);
  for (int64_t h = 0; h < p.Hq; ++h)
    for (int64_t d = 0; d < p.D; ++d)
      ASSERT_EQ(f(out[size_t(h * p.D + d)]), p.v[0][size_t((h / 4) * p.D + d)]) << h << "," << d;
}

TEST(OpsPagedAttention, EqualKeysAverageValues) {
  // Two context tokens with identical keys: weights 1/2 each, output = (v0 + v1) / 2.
  Problem p = make_problem({1}, {2}, DType::bf16, 2);
  for (int64_t i = 0; i < p.Hkv * p.D; ++i) p.k[0][size_t(p.Hkv * p.D + i)] = p.k[0][size_t(i)];
  const Cache c = build_cache(p, KvLayout::hnd, 1, DType::bf16, 2);
  const auto out = run(p, c);
  for (int64_t h = 0; h < p.Hq; ++h) {
    for (int64_t d = 0; d < p.D; ++d) {
      const int64_t i = (h / 4) * p.D + d;
      const bf16_t want = f32_to_bf16((p.v[0][size_t(i)] + p.v[0][size_t(p.Hkv * p.D + i)]) * 0.5f);
      ASSERT_EQ(out[size_t(h * p.D + d)].bits, want.bits) << h << "," << d;
    }
  }
}

TEST(OpsPagedAttention, MixedBatchMatchesFp64AndIsLayoutInvariant) {
  // Sequence 0: prefill of 5 over a cached prefix of 14; 1: fresh prefill of 23; 2 and 3: decode rows.
  Problem p = make_problem({5, 23, 1, 1}, {19, 23, 37, 1}, DType::bf16, 3);
  std::vector<bf16_t> first;
  for (int page : {1, 16, 32}) {
    for (KvLayout layout : {KvLayout::nhd, KvLayout::hnd}) {
      const Cache c = build_cache(p, layout, page, DType::bf16, uint32_t(page));
      const auto out = run(p, c);
      if (first.empty()) {
        first = out;
        EXPECT_LE(reference_error(p, out), std::ldexp(1.0, -8));
      } else {
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_EQ(out[i].bits, first[i].bits)
              << "page " << page << " layout " << int(layout) << " at " << i;
      }
    }
  }
  // Each sequence alone gives the same rows bit for bit.
  int64_t row = 0;
  for (size_t b = 0; b < p.kv_lens.size(); ++b) {
    Problem one = p;
    one.q_lens = {p.q_lens[b]};
    one.kv_lens = {p.kv_lens[b]};
    one.k = {p.k[b]};
    one.v = {p.v[b]};
    one.q.assign(p.q.begin() + row * p.Hq * p.D, p.q.begin() + (row + p.q_lens[b]) * p.Hq * p.D);
    const auto out = run(one, build_cache(one, KvLayout::nhd, 16, DType::bf16, 9));
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i].bits, first[size_t(row * p.Hq * p.D) + i].bits);
    row += p.q_lens[b];
  }
}

TEST(OpsPagedAttention, F16AndFp8Caches) {
  for (DType dt : {DType::f16, DType::f8e4m3}) {
    const Problem q = make_problem({4, 1}, {9, 30}, dt, 4, 128);
    std::vector<bf16_t> first;
    for (KvLayout layout : {KvLayout::nhd, KvLayout::hnd}) {
      const auto out = run(q, build_cache(q, layout, 16, dt, 5));
      if (first.empty()) {
        first = out;
        EXPECT_LE(reference_error(q, out), std::ldexp(1.0, -8)) << dtype_name(dt);
      } else {
        for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i].bits, first[i].bits) << dtype_name(dt);
      }
    }
  }
}

TEST(OpsPagedAttention, RejectsBadMetadata) {
  Problem p = make_problem({2}, {4}, DType::bf16, 6);
  Cache c = build_cache(p, KvLayout::nhd, 16, DType::bf16, 6);
  std::vector<int32_t> cu = {0, 2}, kv = {1};  // kv_len < q_len
  std::vector<bf16_t> out(p.q.size());
  ops::PagedAttentionArgs a;
  a.q = Tensor(p.q.data(), DType::bf16, {2, p.Hq, p.D});
  a.cache = c.view;
  a.cu_q = Tensor(cu.data(), DType::i32, {2});
  a.kv_lens = Tensor(kv.data(), DType::i32, {1});
  a.page_table = Tensor(c.page_table.data(), DType::i32, {1, c.pages_stride});
  a.out = Tensor(out.data(), DType::bf16, {2, p.Hq, p.D});
  a.scale = 0.125f;
  EXPECT_THROW(ops::paged_attention(a), Error);
  kv[0] = 4;
  c.page_table[0] = 1000;  // page out of range
  EXPECT_THROW(ops::paged_attention(a), Error);
  c.page_table[0] = 0;
  kv[0] = int32_t(c.pages_stride * 16 + 1);  // longer than the page table
  EXPECT_THROW(ops::paged_attention(a), Error);
  kv[0] = 4;
  a.out = Tensor(out.data(), DType::bf16, {2, p.Hq, p.D - 1});
  EXPECT_THROW(ops::paged_attention(a), Error);
}
