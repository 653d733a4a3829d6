// CPU paged attention: one work item per (query row, query head); each computes its scores over the
// positions it attends to in ascending order, so the result is independent of batching, page size and
// layout, and a token-tree row is the causal row of the sequence made of its visible positions.
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "ops/cpu/dot.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/reference.h"
#include "ops/fp8.h"

namespace kiln::ops::cpu {
namespace {

// A query row attends to every position before `window` and to window + i for each bit i of `mask`. A causal
// row has window = its position + 1 and no mask, so both kinds run one loop.
struct Row {
  int32_t seq;     // sequence index b
  int32_t window;  // first position of b's tree window (causal: the row's context position + 1)
  uint64_t mask;   // window positions seen (bit i: window + i)
  int32_t visible() const { return window + std::popcount(mask); }
};

// Widens one token's head vector (K or V) to fp32.
struct CacheReader {
  const KvCacheView& c;
  int64_t D;
  // Element offset of (page, row, head, 0) in k / v, and of its first scale byte.
  int64_t offset(const Tensor& t, int64_t page, int64_t row, int64_t head) const {
    return c.layout == KvLayout::nhd ? page * t.stride[0] + row * t.stride[1] + head * t.stride[2]
                                     : page * t.stride[0] + head * t.stride[1] + row * t.stride[2];
  }
  void read(const Tensor& t, const Tensor& scale, int64_t page, int64_t row, int64_t head, float* dst) const {
    const int64_t off = offset(t, page, row, head);
    switch (t.dtype) {
      case DType::bf16: {
        const bf16_t* p = t.ptr<bf16_t>() + off;
        for (int64_t d = 0; d < D; ++d) dst[d] = bf16_to_f32(p[d]);
        break;
      }
      case DType::f16: {
        const f16_t* p = t.ptr<f16_t>() + off;
        for (int64_t d = 0; d < D; ++d) dst[d] = f16_to_f32(p[d]);
        break;
      }
      default: {  // f8e4m3: value * 2^(scale - 127), one scale per 64 elements
        const uint8_t* p = t.ptr<uint8_t>() + off;
        const uint8_t* s = scale.ptr<uint8_t>() + offset(scale, page, row, head);
        for (int64_t d = 0; d < D; ++d) dst[d] = e4m3_to_f32(p[d]) * ue8m0_to_f32(s[d / 64]);
        break;
      }
    }
  }
};

}  // namespace

void paged_attention(const PagedAttentionArgs& a) {
  const int64_t T = a.q.shape[0], Hq = a.q.shape[1], D = a.q.shape[2];
  const KvCacheView& c = a.cache;
  const int64_t Hkv = c.k.shape[c.layout == KvLayout::nhd ? 2 : 1];
  const int64_t group = Hq / Hkv;
  const int64_t B = a.kv_lens.shape[0], stride = a.page_table.shape[1], num_pages = c.k.shape[0];
  const int32_t* cu = a.cu_q.ptr<int32_t>();
  const int32_t* kv_lens = a.kv_lens.ptr<int32_t>();
  const int32_t* pt = a.page_table.ptr<int32_t>();

  // Validate the (host-readable) metadata so bad input is an error, not a stray read.
  KILN_CHECK(cu[0] == 0 && cu[B] <= T, "paged_attention: cu_q must start at 0 and end at most at T = ", T);
  const bool tree = a.tree_window.data != nullptr || a.tree_window.ndim > 0;
  const int32_t* windows = tree ? a.tree_window.ptr<int32_t>() : nullptr;
  const int64_t* masks = tree ? a.tree_mask.ptr<int64_t>() : nullptr;
  std::vector<Row> rows(size_t(T), Row{-1, 0, 0});
  for (int64_t b = 0; b < B; ++b) {
    const int32_t q_len = cu[b + 1] - cu[b];
    KILN_CHECK(q_len >= 0, "paged_attention: cu_q decreases at ", b);
    KILN_CHECK(kv_lens[b] >= q_len, "paged_attention: sequence ", b, " kv_len ", kv_lens[b], " < q_len ",
               q_len);
    KILN_CHECK(int64_t(kv_lens[b]) <= stride * c.page_size, "paged_attention: sequence ", b,
               " page table too short for kv_len ", kv_lens[b]);
    for (int64_t i = 0; i < (kv_lens[b] + c.page_size - 1) / c.page_size; ++i) {
      const int32_t p = pt[b * stride + i];
      KILN_CHECK(p >= 0 && p < num_pages, "paged_attention: sequence ", b, " page ", p, " out of range");
    }
    const int32_t W = tree ? windows[b] : 0;
    // The mask rules of kiln/batch.h, checked here too: a bit past the row's own position would read beyond
    // the context or into a row's future.
    KILN_CHECK(W >= 0 && W <= 64 && (W == 0 || (W >= q_len && W <= kv_lens[b])), "paged_attention: sequence ",
               b, " tree_window ", W, " must be 0 or in [q_len ", q_len, ", min(64, kv_len ", kv_lens[b],
               ")]");
    for (int32_t i = 0; i < q_len; ++i) {
      const int32_t pos = kv_lens[b] - q_len + i;
      const uint64_t m = tree ? uint64_t(masks[cu[b] + i]) : 0;
      if (W == 0) {
        KILN_CHECK(m == 0, "paged_attention: sequence ", b, " row ", i,
                   " has a tree_mask outside a tree window");
        rows[size_t(cu[b] + i)] = Row{int32_t(b), pos + 1, 0};
        continue;
      }
      const int32_t own = W - q_len + i;
      KILN_CHECK(((m >> own) & 1) && (own == 63 || (m >> (own + 1)) == 0), "paged_attention: sequence ", b,
                 " row ", i, " tree_mask must have its own bit ", own, " set and none above it");
      rows[size_t(cu[b] + i)] = Row{int32_t(b), kv_lens[b] - W, m};
    }
  }

  const CacheReader reader{c, D};
  parallel_for(T * Hq, 4, [&](int64_t w0, int64_t w1) {
    std::vector<float> q(static_cast<size_t>(D)), kv(q), acc(q), scores;
    std::vector<int32_t> cols;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t t = w / Hq, h = w % Hq, hk = h / group;
      const Row r = rows[size_t(t)];
      if (r.seq < 0) continue;  // not covered by cu_q
      const int32_t* pages = pt + r.seq * stride;
      const bf16_t* qp = a.q.ptr<bf16_t>() + t * a.q.stride[0] + h * a.q.stride[1];
      for (int64_t d = 0; d < D; ++d) q[size_t(d)] = bf16_to_f32(qp[d]);
      // The attended positions, ascending: [0, window), then the mask's bits from the lowest.
      const int64_t n = r.visible();
      cols.resize(size_t(n));
      for (int32_t j = 0; j < r.window; ++j) cols[size_t(j)] = j;
      int64_t k = r.window;
      for (uint64_t m = r.mask; m != 0; m &= m - 1) cols[size_t(k++)] = r.window + std::countr_zero(m);
      scores.resize(size_t(n));
      float mx = -INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = cols[size_t(i)];
        reader.read(c.k, c.k_scale, pages[j / c.page_size], j % c.page_size, hk, kv.data());
        scores[size_t(i)] = dot8(q.data(), kv.data(), D) * a.scale;
        mx = std::max(mx, scores[size_t(i)]);
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      float sum = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = cols[size_t(i)];
        const float p = std::exp(scores[size_t(i)] - mx);
        sum += p;
        reader.read(c.v, c.v_scale, pages[j / c.page_size], j % c.page_size, hk, kv.data());
        for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += p * kv[size_t(d)];
      }
      bf16_t* op = a.out.ptr<bf16_t>() + t * a.out.stride[0] + h * a.out.stride[1];
      for (int64_t d = 0; d < D; ++d) op[d] = f32_to_bf16(acc[size_t(d)] / sum);
    }
  });
}

}  // namespace kiln::ops::cpu
