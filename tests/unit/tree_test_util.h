// Shared by the token-tree tests: tests/unit/test_tree_attention.cpp (CPU) and
// tests/cuda/test_cuda_tree_attention.cpp (CUDA against the CPU).
// The attention op: the sequences of a call (lengths; tree windows and masks drawn as random trees, arbitrary
// masks or chains), the positions each row sees, and an output's relative error against fp64 attention over
// exactly those positions. Each test fills K, V and Q and builds its cache its own way.
// The whole model: a BatchDesc built from per-sequence rows (token, rotary position, context position, tree
// mask), each sequence's pages taken from a shared counter as its context grows; a step's logits read back
// with every row checked written and finite; causal prompt rows; a random draft tree's masks, rows and
// root-to-node paths.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kiln/batch.h"
#include "kiln/dtype.h"
#include "kiln/tensor.h"
#include "model/kv_cache.h"
#include "model/qwen3.h"

namespace kiln::test {

// ---------------------------------------------------------------------------------------------------------
// The attention op.

// One sequence of a call: q_len rows, the last of a kv_len context; a tree window of the last `window`
// context positions (0: causal rows).
struct TreeSeqSpec {
  int32_t q_len, kv_len, window;
  bool arbitrary = false;  // masks: any earlier window entries rather than a tree's ancestors
};

// Sequences of an attention call: logical K/V [kv_len, Hkv, D] (before a cache's rounding), queries, tree
// fields (windows empty: a causal call).
struct TreeProblem {
  int64_t Hq = 8, Hkv = 2, D = 64;
  std::vector<int32_t> q_lens, kv_lens;
  std::vector<int32_t> windows;          // [B]; empty: no tree fields
  std::vector<uint64_t> masks;           // [T]
  std::vector<std::vector<float>> k, v;  // per sequence [kv_len, Hkv, D]
  std::vector<bf16_t> q;                 // [T, Hq, D]
  int64_t B() const { return int64_t(kv_lens.size()); }
  int64_t T() const { return std::accumulate(q_lens.begin(), q_lens.end(), int64_t(0)); }
  int32_t first_row(int64_t b) const { return std::accumulate(q_lens.begin(), q_lens.begin() + b, 0); }
  int32_t window(int64_t b) const { return windows.empty() ? 0 : windows[size_t(b)]; }
  // The context positions row i of sequence b attends to, ascending.
  std::vector<int32_t> visible(int64_t b, int32_t i) const {
    const int32_t kv = kv_lens[size_t(b)], pos = kv - q_lens[size_t(b)] + i, W = window(b);
    std::vector<int32_t> out;
    if (W == 0) {
      for (int32_t j = 0; j <= pos; ++j) out.push_back(j);
      return out;
    }
    const uint64_t m = masks[size_t(first_row(b) + i)];
    for (int32_t j = 0; j < kv - W; ++j) out.push_back(j);
    for (int32_t bit = 0; bit < W; ++bit)
      if ((m >> bit) & 1) out.push_back(kv - W + bit);
    return out;
  }
};

// Masks of a W-entry window: a random tree (entry 0 the root, each later entry's parent an earlier one; a
// node sees its ancestors and itself) or, with `arbitrary`, any set of earlier entries plus its own.
inline std::vector<uint64_t> random_window(int32_t W, bool arbitrary, std::mt19937& rng) {
  std::vector<uint64_t> m(static_cast<size_t>(W));
  for (int32_t i = 0; i < W; ++i) {
    const uint64_t own = uint64_t(1) << i;
    if (arbitrary) {
      m[size_t(i)] = (((uint64_t(rng()) << 32) | rng()) & (own - 1)) | own;
    } else {
      m[size_t(i)] = i == 0 ? own : m[size_t(rng() % uint32_t(i))] | own;
    }
  }
  return m;
}

// The lengths and tree fields of the specs, masks drawn from `rng` (rows take the last q_len entries of their
// window), or with `chain` each row's mask every window entry up to its own; no K, V or Q yet.
inline TreeProblem tree_problem_fields(const std::vector<TreeSeqSpec>& specs, int64_t Hq, int64_t Hkv,
                                       int64_t D, std::mt19937& rng, bool chain) {
  TreeProblem p;
  p.Hq = Hq, p.Hkv = Hkv, p.D = D;
  for (const TreeSeqSpec& s : specs) {
    p.q_lens.push_back(s.q_len);
    p.kv_lens.push_back(s.kv_len);
    p.windows.push_back(s.window);
    const std::vector<uint64_t> w = random_window(s.window, s.arbitrary, rng);
    for (int32_t i = 0; i < s.q_len; ++i) {
      const int32_t own = s.window - s.q_len + i;
      if (s.window == 0) {
        p.masks.push_back(0);
      } else if (chain) {
        p.masks.push_back(own == 63 ? ~uint64_t(0) : (uint64_t(2) << own) - 1);
      } else {
        p.masks.push_back(w[size_t(own)]);
      }
    }
  }
  return p;
}

// Relative Frobenius error of `got` against fp64 attention over each row's visible positions, with K / V
// per sequence [kv_len, Hkv, D] (p's own, or the values as a cache stores them).
inline double fp64_attention_error(const TreeProblem& p, const std::vector<std::vector<float>>& k,
                                   const std::vector<std::vector<float>>& v, const std::vector<bf16_t>& got) {
  double num = 0, den = 0;
  const double scale = 1.0 / std::sqrt(double(p.D));
  for (int64_t b = 0; b < p.B(); ++b) {
    for (int32_t i = 0; i < p.q_lens[size_t(b)]; ++i) {
      const int64_t t = p.first_row(b) + i;
      const std::vector<int32_t> vis = p.visible(b, i);
      for (int64_t h = 0; h < p.Hq; ++h) {
        const int64_t hk = h / (p.Hq / p.Hkv);
        std::vector<double> s(vis.size());
        double mx = -1e300, sum = 0;
        for (size_t n = 0; n < vis.size(); ++n) {
          double dot = 0;
          const float* kr = k[size_t(b)].data() + (vis[n] * p.Hkv + hk) * p.D;
          for (int64_t d = 0; d < p.D; ++d)
            dot += double(bf16_to_f32(p.q[size_t((t * p.Hq + h) * p.D + d)])) * kr[d];
          s[n] = dot * scale;
          mx = std::max(mx, s[n]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < p.D; ++d) {
          double o = 0;
          for (size_t n = 0; n < vis.size(); ++n)
            o += s[n] * v[size_t(b)][size_t((vis[n] * p.Hkv + hk) * p.D + d)];
          o /= sum;
          const double g = bf16_to_f32(got[size_t((t * p.Hq + h) * p.D + d)]);
          num += (g - o) * (g - o);
          den += o * o;
        }
      }
    }
  }
  return std::sqrt(num / den);
}

// ---------------------------------------------------------------------------------------------------------
// The whole model.

// One sequence's pages: context position -> slot, pages taken from a shared counter as the context grows.
struct Pages {
  int32_t page_size;
  std::vector<int32_t> pages;
  int64_t slot(int32_t pos, int32_t& next_page) {
    while (int32_t(pages.size()) * page_size <= pos) pages.push_back(next_page++);
    return int64_t(pages[size_t(pos / page_size)]) * page_size + pos % page_size;
  }
};

// A row of a step: its token, rotary position, context position and (in a tree window) mask.
struct StepRow {
  int32_t token, position, context;
  uint64_t mask = 0;
};

struct StepSeq {
  Pages* pages;
  std::vector<StepRow> rows;  // context positions kv_len - q_len .. kv_len - 1, in order
  int32_t kv_len;
  int32_t window = 0;
  bool last_logits_only = false;  // a prompt chunk: logits of its last row only
};

// The step over `seqs` (tree fields only where some sequence has a window; every row's logits but for
// last_logits_only sequences); mrope: text rows' three-row M-RoPE positions (BatchDesc::set_text_mrope).
inline BatchDesc make_step(std::vector<StepSeq> seqs, int32_t page_size, int32_t& next_page,
                           bool mrope = false) {
  BatchDesc b;
  b.page_size = page_size;
  b.cu_q = {0};
  bool tree = false;
  for (StepSeq& s : seqs) {
    for (size_t i = 0; i < s.rows.size(); ++i) {
      const StepRow& r = s.rows[i];
      if (!s.last_logits_only || i + 1 == s.rows.size()) b.logit_rows.push_back(b.num_tokens());
      b.tokens.push_back(r.token);
      b.positions.push_back(r.position);
      b.slot_mapping.push_back(s.pages->slot(r.context, next_page));
      b.tree_mask.push_back(r.mask);
    }
    b.cu_q.push_back(b.num_tokens());
    b.kv_lens.push_back(s.kv_len);
    b.tree_window.push_back(s.window);
    tree = tree || s.window > 0;
  }
  if (!tree) {
    b.tree_window.clear();
    b.tree_mask.clear();
  }
  b.pages_stride = 1;
  for (const StepSeq& s : seqs) b.pages_stride = std::max(b.pages_stride, int32_t(s.pages->pages.size()));
  for (const StepSeq& s : seqs) {
    std::vector<int32_t> row = s.pages->pages;
    row.resize(size_t(b.pages_stride), 0);
    b.page_table.insert(b.page_table.end(), row.begin(), row.end());
  }
  if (mrope) b.set_text_mrope();
  return b;
}

// Every logit row of the step, on the model's device, the buffer poisoned (NaN) first; a logit left
// unwritten or not finite fails the test.
inline std::vector<std::vector<float>> step_logits(Qwen3Model& m, KvCache& cache, const BatchDesc& b) {
  const int64_t V = m.config().vocab_size, R = int64_t(b.logit_rows.size());
  std::vector<float> logits(size_t(R * V), std::numeric_limits<float>::quiet_NaN());
  Buffer dl(logits.size() * 4, m.device());
  copy_bytes(dl.data(), m.device(), logits.data(), Device::cpu(), logits.size() * 4);
  m.forward(b, cache, Tensor(dl.data(), DType::f32, {R, V}, m.device()));
  copy_bytes(logits.data(), Device::cpu(), dl.data(), m.device(), logits.size() * 4);
  std::vector<std::vector<float>> out;
  for (int64_t r = 0; r < R; ++r) {
    out.emplace_back(logits.begin() + r * V, logits.begin() + (r + 1) * V);
    const auto bad =
        std::count_if(out.back().begin(), out.back().end(), [](float x) { return !std::isfinite(x); });
    if (bad)
      ADD_FAILURE() << device_name(m.device()) << ": " << bad << " logits of row " << r
                    << " unwritten or not finite";
  }
  return out;
}

// Causal rows of `tokens` from context = rotary position `first`.
inline std::vector<StepRow> causal_rows(const std::vector<int32_t>& tokens, int32_t first = 0) {
  std::vector<StepRow> rows;
  for (size_t i = 0; i < tokens.size(); ++i)
    rows.push_back({tokens[i], first + int32_t(i), first + int32_t(i)});
  return rows;
}

// A tree of draft tokens below the root (the sequence's last token, at context and rotary position p0): node
// i (0-based) has a parent among the root (-1) and the earlier nodes, sits at context position p0 + 1 + i
// and rotates at p0 + its depth.
struct DraftTree {
  std::vector<int32_t> parent, token, depth;
  void add(int32_t par, int32_t tok) {
    parent.push_back(par);
    token.push_back(tok);
    depth.push_back(par < 0 ? 1 : depth[size_t(par)] + 1);
  }
  // Root's token, then the tokens from the root's child down to node i.
  std::vector<int32_t> path(int32_t root, int32_t i) const {
    std::vector<int32_t> out;
    for (int32_t n = i; n >= 0; n = parent[size_t(n)]) out.push_back(token[size_t(n)]);
    out.push_back(root);
    std::reverse(out.begin(), out.end());
    return out;
  }
  // Window bits of node i (window bit 0 the root, bit 1 + n node n).
  uint64_t mask(int32_t i) const {
    uint64_t m = 1;
    for (int32_t n = i; n >= 0; n = parent[size_t(n)]) m |= uint64_t(1) << (1 + n);
    return m;
  }
  // Node i's row in a step of the tree over a root at p0.
  StepRow row(int32_t i, int32_t p0) const {
    return {token[size_t(i)], p0 + depth[size_t(i)], p0 + 1 + i, mask(i)};
  }
};

}  // namespace kiln::test
