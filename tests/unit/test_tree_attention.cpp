// Token-tree attention on the CPU (ops/attention.h tree_window / tree_mask; kiln/batch.h): random trees
// against an fp64 reference and, bit for bit, against the causal attention over a cache holding exactly each
// row's visible positions; chain masks are the causal rows; BatchDesc::validate's and the op's refusals; the
// checks of the fields on a CUDA call and the graphs' refusal of trees; and a whole Qwen3 model whose tree
// step gives every node the logits of a plain step-by-step decode of its path.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/moe_checkpoints.h"
#include "common/test_support.h"
#include "kiln/batch.h"
#include "kiln/config.h"
#include "model/cuda_graph.h"
#include "model/kv_cache.h"
#include "model/qwen3.h"
#include "ops/attention.h"
#include "runtime/model_runner.h"

using namespace kiln;
using ops::KvLayout;
using test_support::error_of;
using test_support::expect_contains;

namespace {

constexpr uint16_t kPoisonBits = 0x7fc1;  // a bf16 NaN: an output row left unwritten shows

// Sequences of an attention call: logical K/V [kv_len, Hkv, D] (bf16 values), queries, tree fields.
struct Problem {
  int64_t Hq = 8, Hkv = 2, D = 64;
  std::vector<int32_t> q_lens, kv_lens;
  std::vector<int32_t> windows;          // [B]; empty: no tree fields
  std::vector<uint64_t> masks;           // [T]
  std::vector<std::vector<float>> k, v;  // per sequence [kv_len, Hkv, D]
  std::vector<bf16_t> q;                 // [T, Hq, D]
  int64_t B() const { return int64_t(kv_lens.size()); }
  int64_t T() const { return std::accumulate(q_lens.begin(), q_lens.end(), int64_t(0)); }
  int32_t first_row(int64_t b) const { return std::accumulate(q_lens.begin(), q_lens.begin() + b, 0); }
  // The context positions row i of sequence b attends to, ascending.
  std::vector<int32_t> visible(int64_t b, int32_t i) const {
    const int32_t kv = kv_lens[size_t(b)], pos = kv - q_lens[size_t(b)] + i;
    const int32_t W = windows.empty() ? 0 : windows[size_t(b)];
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

void fill_values(Problem& p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.5f, 1.5f);
  p.k.clear();
  p.v.clear();
  for (int32_t kv : p.kv_lens) {
    std::vector<float> k(size_t(kv * p.Hkv * p.D)), v(k.size());
    for (auto& x : k) x = bf16_to_f32(f32_to_bf16(d(rng)));
    for (auto& x : v) x = bf16_to_f32(f32_to_bf16(d(rng)));
    p.k.push_back(std::move(k));
    p.v.push_back(std::move(v));
  }
  p.q.resize(size_t(p.T() * p.Hq * p.D));
  for (auto& x : p.q) x = f32_to_bf16(d(rng));
}

// A bf16 paged cache of the problem's K/V, pages handed out in a shuffled order, garbage (NaN) elsewhere.
struct Cache {
  std::vector<bf16_t> k, v;
  ops::KvCacheView view;
  std::vector<int32_t> page_table;
  int64_t pages_stride = 0;
};

Cache build_cache(const Problem& p, KvLayout layout, int page_size, uint32_t seed) {
  Cache c;
  int64_t total = 0, widest = 1;
  for (int32_t l : p.kv_lens) {
    const int64_t n = (l + page_size - 1) / page_size;
    total += n;
    widest = std::max(widest, n);
  }
  const int64_t num_pages = total + 2;
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  c.pages_stride = widest + 1;
  c.page_table.assign(size_t(p.B() * c.pages_stride), 0);
  int64_t next = 0;
  for (int64_t b = 0; b < p.B(); ++b)
    for (int64_t i = 0; i < (p.kv_lens[size_t(b)] + page_size - 1) / page_size; ++i)
      c.page_table[size_t(b * c.pages_stride + i)] = perm[size_t(next++)];
  const int64_t n = num_pages * page_size * p.Hkv * p.D;
  c.k.assign(size_t(n), bf16_t{kPoisonBits});
  c.v.assign(size_t(n), bf16_t{kPoisonBits});
  const auto make = [&](bf16_t* data) {
    return layout == KvLayout::nhd ? Tensor(data, DType::bf16, {num_pages, page_size, p.Hkv, p.D})
                                   : Tensor(data, DType::bf16, {num_pages, p.Hkv, page_size, p.D});
  };
  c.view.layout = layout;
  c.view.page_size = page_size;
  c.view.k = make(c.k.data());
  c.view.v = make(c.v.data());
  for (int64_t b = 0; b < p.B(); ++b) {
    for (int64_t j = 0; j < p.kv_lens[size_t(b)]; ++j) {
      const int64_t page = c.page_table[size_t(b * c.pages_stride + j / page_size)], row = j % page_size;
      for (int64_t h = 0; h < p.Hkv; ++h) {
        const int64_t base = layout == KvLayout::nhd ? ((page * page_size + row) * p.Hkv + h) * p.D
                                                     : ((page * p.Hkv + h) * page_size + row) * p.D;
        for (int64_t d = 0; d < p.D; ++d) {
          const size_t src = size_t((j * p.Hkv + h) * p.D + d);
          c.k[size_t(base + d)] = f32_to_bf16(p.k[size_t(b)][src]);
          c.v[size_t(base + d)] = f32_to_bf16(p.v[size_t(b)][src]);
        }
      }
    }
  }
  return c;
}

// The attention's tensors over host vectors the caller keeps alive.
struct Call {
  std::vector<int32_t> cu, kv, windows;
  std::vector<int64_t> masks;
  std::vector<bf16_t> out;
  ops::PagedAttentionArgs a;
};

void prepare(const Problem& p, const Cache& c, Call& call) {
  const int64_t T = p.T(), B = p.B();
  call.cu.assign(size_t(B + 1), 0);
  for (int64_t b = 0; b < B; ++b) call.cu[size_t(b + 1)] = call.cu[size_t(b)] + p.q_lens[size_t(b)];
  call.kv = p.kv_lens;
  call.out.assign(size_t(T * p.Hq * p.D), bf16_t{kPoisonBits});
  ops::PagedAttentionArgs& a = call.a;
  a.q = Tensor(const_cast<bf16_t*>(p.q.data()), DType::bf16, {T, p.Hq, p.D});
  a.cache = c.view;
  a.cu_q = Tensor(call.cu.data(), DType::i32, {B + 1});
  a.kv_lens = Tensor(call.kv.data(), DType::i32, {B});
  a.page_table = Tensor(const_cast<int32_t*>(c.page_table.data()), DType::i32, {B, c.pages_stride});
  a.out = Tensor(call.out.data(), DType::bf16, {T, p.Hq, p.D});
  a.scale = 1.0f / std::sqrt(float(p.D));
  if (!p.windows.empty()) {
    call.windows = p.windows;
    call.masks.assign(p.masks.begin(), p.masks.end());
    a.tree_window = Tensor(call.windows.data(), DType::i32, {B});
    a.tree_mask = Tensor(call.masks.data(), DType::i64, {T});
  }
}

std::vector<bf16_t> run(const Problem& p, const Cache& c) {
  Call call;
  prepare(p, c, call);
  ops::paged_attention(call.a);
  for (size_t i = 0; i < call.out.size(); ++i)
    if (!std::isfinite(bf16_to_f32(call.out[i]))) {
      ADD_FAILURE() << "output element " << i << " unwritten or not finite";
      break;
    }
  return call.out;
}

// Relative Frobenius error of `got` against fp64 attention over each row's visible positions.
double reference_error(const Problem& p, const std::vector<bf16_t>& got) {
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
          for (int64_t d = 0; d < p.D; ++d)
            dot += double(bf16_to_f32(p.q[size_t((t * p.Hq + h) * p.D + d)])) *
                   p.k[size_t(b)][size_t((vis[n] * p.Hkv + hk) * p.D + d)];
          s[n] = dot * scale;
          mx = std::max(mx, s[n]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < p.D; ++d) {
          double o = 0;
          for (size_t n = 0; n < vis.size(); ++n)
            o += s[n] * p.v[size_t(b)][size_t((vis[n] * p.Hkv + hk) * p.D + d)];
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

// One causal sequence per row of p: its query and exactly its visible positions' K/V, in order.
Problem gathered(const Problem& p) {
  Problem g;
  g.Hq = p.Hq, g.Hkv = p.Hkv, g.D = p.D;
  g.q = p.q;
  const int64_t HD = p.Hkv * p.D;
  for (int64_t b = 0; b < p.B(); ++b) {
    for (int32_t i = 0; i < p.q_lens[size_t(b)]; ++i) {
      const std::vector<int32_t> vis = p.visible(b, i);
      std::vector<float> k, v;
      for (int32_t j : vis) {
        k.insert(k.end(), p.k[size_t(b)].begin() + j * HD, p.k[size_t(b)].begin() + (j + 1) * HD);
        v.insert(v.end(), p.v[size_t(b)].begin() + j * HD, p.v[size_t(b)].begin() + (j + 1) * HD);
      }
      g.q_lens.push_back(1);
      g.kv_lens.push_back(int32_t(vis.size()));
      g.k.push_back(std::move(k));
      g.v.push_back(std::move(v));
    }
  }
  return g;
}

// Masks of a W-entry window: a random tree (entry 0 the root, each later entry's parent an earlier one; a
// node sees its ancestors and itself) or, with `arbitrary`, any set of earlier entries plus its own.
std::vector<uint64_t> random_window(int32_t W, bool arbitrary, std::mt19937& rng) {
  std::vector<uint64_t> m(static_cast<size_t>(W));
  for (int32_t i = 0; i < W; ++i) {
    const uint64_t own = uint64_t(1) << i;
    if (arbitrary) {
      const uint64_t below = own - 1;
      m[size_t(i)] = (((uint64_t(rng()) << 32) | rng()) & below) | own;
    } else {
      m[size_t(i)] = i == 0 ? own : m[size_t(rng() % uint32_t(i))] | own;
    }
  }
  return m;
}

struct SeqSpec {
  int32_t q_len, kv_len, window;
  bool arbitrary = false;  // masks: any earlier entries rather than a tree's ancestors
};

// The tree problem of the specs (rows take the last q_len entries of their window), or with `chain` each
// row's mask all window entries up to its own.
Problem tree_problem(const std::vector<SeqSpec>& specs, int64_t Hq, int64_t Hkv, int64_t D, uint32_t seed,
                     bool chain = false) {
  Problem p;
  p.Hq = Hq, p.Hkv = Hkv, p.D = D;
  std::mt19937 rng(seed);
  for (const SeqSpec& s : specs) {
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
  fill_values(p, seed + 1);
  return p;
}

// Sequences of every kind: a verify tree over a cached prefix, plain decode and prefill rows, draft passes
// whose window holds earlier tree entries already cached (W > q_len), the widest window, a window that is the
// whole context, arbitrary masks, an empty sequence.
std::vector<SeqSpec> mixed_specs() {
  return {{7, 19, 7}, {1, 30, 0},        {5, 40, 13}, {3, 9, 0},   {64, 70, 64},
          {4, 4, 4},  {6, 25, 20, true}, {0, 5, 0},   {2, 60, 55}, {1, 12, 9}};
}

}  // namespace

TEST(TreeAttention, RandomTreesMatchFp64AndTheGatheredCausalRowsBitwise) {
  struct Heads {
    int64_t Hq, Hkv, D;
  };
  for (const Heads h : {Heads{8, 2, 64}, Heads{6, 1, 128}, Heads{4, 4, 64}}) {
    for (uint32_t seed : {11u, 12u, 13u}) {
      const Problem p = tree_problem(mixed_specs(), h.Hq, h.Hkv, h.D, seed * 7 + uint32_t(h.D));
      std::vector<bf16_t> first;
      for (int page : {1, 5, 16}) {
        for (KvLayout layout : {KvLayout::nhd, KvLayout::hnd}) {
          const auto out = run(p, build_cache(p, layout, page, seed + uint32_t(page)));
          if (first.empty()) {
            first = out;
            // The contract's bound for any implementation (ops/attention.h).
            EXPECT_LE(reference_error(p, out), std::ldexp(1.0, -7)) << "seed " << seed << " Hq " << h.Hq;
            continue;
          }
          for (size_t i = 0; i < out.size(); ++i)
            ASSERT_EQ(out[i].bits, first[i].bits)
                << "page " << page << " layout " << int(layout) << " at " << i;
        }
      }
      // Every row is the causal attention of a sequence made of its visible positions, bit for bit.
      const Problem g = gathered(p);
      ASSERT_EQ(g.T(), p.T());
      for (int page : {3, 16}) {
        const auto want = run(g, build_cache(g, KvLayout::nhd, page, seed));
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(first[i].bits, want[i].bits)
              << "seed " << seed << " Hq " << h.Hq << " row " << int64_t(i) / (p.Hq * p.D);
      }
    }
  }
}

TEST(TreeAttention, ChainMasksAreTheCausalRows) {
  const std::vector<SeqSpec> specs = {{5, 20, 5}, {3, 30, 17},  {1, 8, 1},
                                      {4, 9, 0},  {64, 64, 64}, {2, 11, 11}};
  for (uint32_t seed : {1u, 2u}) {
    const Problem chain = tree_problem(specs, 8, 2, 64, seed, /*chain=*/true);
    Problem causal = chain;
    causal.windows.clear();
    causal.masks.clear();
    for (int page : {1, 16}) {
      const Cache c = build_cache(chain, KvLayout::hnd, page, seed);
      const auto a = run(chain, c), b = run(causal, c);
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i].bits, b[i].bits) << "page " << page << " at " << i;
    }
  }
}

TEST(TreeAttention, OpRejectsBadTreeFields) {
  Problem p = tree_problem({{3, 10, 5}, {1, 4, 0}}, 8, 2, 64, 3);
  const Cache c = build_cache(p, KvLayout::nhd, 4, 3);
  const auto fails = [&](const std::function<void(Call&)>& edit, std::initializer_list<std::string> parts) {
    Call call;
    prepare(p, c, call);
    edit(call);
    expect_contains(error_of([&] { ops::paged_attention(call.a); }), parts);
  };
  {  // the problem as built runs
    Call call;
    prepare(p, c, call);
    EXPECT_NO_THROW(ops::paged_attention(call.a));
  }
  fails([](Call& k) { k.a.tree_mask = Tensor(); }, {"tree_window and tree_mask"});
  fails([](Call& k) { k.a.tree_window = Tensor(); }, {"tree_window and tree_mask"});
  fails([](Call& k) { k.a.tree_window = Tensor(k.windows.data(), DType::i64, {1}); }, {"tree_window"});
  fails([](Call& k) { k.a.tree_window = Tensor(k.windows.data(), DType::i32, {1}); }, {"tree_window"});
  fails([](Call& k) { k.a.tree_mask = Tensor(k.masks.data(), DType::i32, {4}); }, {"tree_mask"});
  fails([](Call& k) { k.a.tree_mask = Tensor(k.masks.data(), DType::i64, {3}); }, {"tree_mask"});
  fails([](Call& k) { k.a.tree_mask = Tensor(k.masks.data(), DType::i64, {4}, Device::cuda()); },
        {"tree_mask", "cuda:0"});
  // Values: the rules of kiln/batch.h, so a bad mask is an error rather than a read past the context.
  fails([](Call& k) { k.windows[0] = 2; }, {"tree_window"});   // W < q_len
  fails([](Call& k) { k.windows[0] = 65; }, {"tree_window"});  // W > 64
  fails([](Call& k) { k.windows[0] = 11; }, {"tree_window"});  // W > kv_len
  fails([](Call& k) { k.windows[0] = -1; }, {"tree_window"});
  fails([](Call& k) { k.masks[0] &= ~int64_t(4); }, {"tree_mask", "own bit 2"});  // row 0's own bit is 2
  fails([](Call& k) { k.masks[1] |= int64_t(16); }, {"tree_mask", "own bit 3"});
  fails([](Call& k) { k.masks[3] = 1; }, {"tree_mask outside a tree window"});
}

TEST(TreeAttention, CudaCallsCheckTheTreeFieldsBeforeAnyLaunch) {
  // Views that claim the GPU over host memory: the dispatcher checks the fields (here a mask left on the
  // host) before it reads or launches anything, in a CUDA build as in a CPU-only one. The CUDA kernels
  // themselves run in tests/cuda/test_cuda_tree_attention.cpp.
  Problem p = tree_problem({{2, 6, 2}}, 8, 2, 64, 4);
  const Cache c = build_cache(p, KvLayout::nhd, 4, 4);
  Call call;
  prepare(p, c, call);
  const Device gpu = Device::cuda();
  ops::PagedAttentionArgs& a = call.a;
  for (Tensor* t : {&a.q, &a.out, &a.cache.k, &a.cache.v, &a.cu_q, &a.kv_lens, &a.page_table, &a.tree_window})
    t->device = gpu;
  expect_contains(error_of([&] { ops::paged_attention(a); }), {"tree_mask", "cpu"});
  // Graphs run no tree: the graphs' batch copy (which would drop the masks) refuses one, and neither graph
  // predicate takes a tree batch, so the runners send it down the eager path.
  BatchDesc b;
  b.tokens = {1, 2};
  b.positions = {4, 5};
  b.slot_mapping = {4, 5};
  b.cu_q = {0, 2};
  b.kv_lens = {6};
  b.page_size = 4;
  b.pages_stride = 2;
  b.page_table = {0, 1};
  b.logit_rows = {0, 1};
  b.tree_window = {2};
  b.tree_mask = {1, 3};
  BatchDesc out;
  expect_contains(error_of([&] { copy_with_table_width(b, 1, 2, out); }), {"token-tree", "eagerly"});
  EXPECT_FALSE(is_uniform_verify(b, 2));
  BatchDesc one = b;  // a draft pass of one frontier node: one row, a wider window
  one.tokens = {2};
  one.positions = {5};
  one.slot_mapping = {5};
  one.cu_q = {0, 1};
  one.logit_rows = {0};
  one.tree_mask = {3};
  EXPECT_FALSE(is_graphable_decode(one));
  b.tree_window.clear();
  b.tree_mask.clear();
  EXPECT_TRUE(is_uniform_verify(b, 2));
  one.tree_window.clear();
  one.tree_mask.clear();
  EXPECT_TRUE(is_graphable_decode(one));
}

TEST(TreeAttention, BatchDescValidateRejectsBadTrees) {
  // Sequence 0: a 4-entry window (root at bit 0 cached, rows = entries 1..3); sequence 1: causal decode.
  BatchDesc good;
  good.tokens = {3, 4, 5, 6};
  good.positions = {7, 8, 8, 7};
  good.slot_mapping = {8, 9, 10, 16};
  good.cu_q = {0, 3, 4};
  good.kv_lens = {11, 1};
  good.page_size = 8;
  good.pages_stride = 2;
  good.page_table = {0, 1, 2, 0};
  good.tree_window = {4, 0};
  good.tree_mask = {0b0011, 0b0101, 0b1011, 0};
  EXPECT_NO_THROW(good.validate(100, 4));
  const auto fails = [&](const std::function<void(BatchDesc&)>& edit,
                         std::initializer_list<std::string> parts) {
    BatchDesc b = good;
    edit(b);
    expect_contains(error_of([&] { b.validate(100, 4); }), parts);
  };
  fails([](BatchDesc& b) { b.tree_mask[1] = 0b0001; }, {"row 1", "does not see its own position"});
  fails([](BatchDesc& b) { b.tree_mask[0] = 0b0111; }, {"row 0", "sees a later position"});
  fails([](BatchDesc& b) { b.tree_mask[3] = 1; }, {"sequence 1", "outside a tree window"});
  fails([](BatchDesc& b) { b.tree_window[0] = 65; }, {"tree window 65", "outside [0, 64]"});
  fails([](BatchDesc& b) { b.tree_window[0] = -1; }, {"outside [0, 64]"});
  fails([](BatchDesc& b) { b.tree_window[0] = 2; }, {"must hold its 3 new tokens"});  // W < q_len
  fails([](BatchDesc& b) { b.tree_window[1] = 2; }, {"sequence 1", "fit its context of 1"});
  fails([](BatchDesc& b) { b.tree_window.push_back(0); }, {"tree_window size"});
  fails([](BatchDesc& b) { b.tree_mask.pop_back(); }, {"tree_mask size"});
  fails([](BatchDesc& b) { b.tree_mask.clear(); }, {"both be set or both empty"});
  fails([](BatchDesc& b) { b.tree_window.clear(); }, {"both be set or both empty"});
}

// ---------------------------------------------------------------------------------------------------------
// The whole model.

namespace {

ModelConfig dense_config() {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 301;
  c.hidden_size = 96;
  c.intermediate_size = 160;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = false;
  return c;
}

// The Qwen3-VL text decoder's rotary (M-RoPE, interleaved) on the dense shapes: text rows rotate as plain
// RoPE does, but through the three-row position path.
ModelConfig vl_text_config() {
  ModelConfig c = dense_config();
  c.arch = ModelArch::qwen3_vl_text;
  c.architecture = "Qwen3VLForConditionalGeneration";
  c.mrope_section = {12, 10, 10};
  c.mrope_interleaved = true;
  return c;
}

ModelConfig moe_config() {
  const nlohmann::json dense = nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 301, "hidden_size": 96,
    "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "max_position_embeddings": 128, "tie_word_embeddings": false, "dtype": "bfloat16"})");
  return parse_model_config(test::moe_config_json(dense, 4, 2, 32, true).dump(), "test moe config");
}

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
};

BatchDesc make_step(std::vector<StepSeq> seqs, int32_t page_size, int32_t& next_page, bool mrope) {
  BatchDesc b;
  b.page_size = page_size;
  b.cu_q = {0};
  bool tree = false;
  for (StepSeq& s : seqs) {
    for (const StepRow& r : s.rows) {
      b.logit_rows.push_back(b.num_tokens());
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

// Every logit row of the step, the buffer poisoned first; a logit left unwritten fails the test.
std::vector<std::vector<float>> forward(Qwen3Model& m, KvCache& cache, const BatchDesc& b) {
  const int64_t V = m.config().vocab_size, R = int64_t(b.logit_rows.size());
  std::vector<float> logits(size_t(R * V), std::numeric_limits<float>::quiet_NaN());
  m.forward(b, cache, Tensor(logits.data(), DType::f32, {R, V}));
  std::vector<std::vector<float>> out;
  for (int64_t r = 0; r < R; ++r) {
    out.emplace_back(logits.begin() + r * V, logits.begin() + (r + 1) * V);
    const auto bad =
        std::count_if(out.back().begin(), out.back().end(), [](float x) { return !std::isfinite(x); });
    if (bad) ADD_FAILURE() << bad << " logits of row " << r << " unwritten or not finite";
  }
  return out;
}

// A prompt of causal rows at context = rotary position.
std::vector<StepRow> prompt_rows(const std::vector<int32_t>& prompt) {
  std::vector<StepRow> rows;
  for (size_t i = 0; i < prompt.size(); ++i) rows.push_back({prompt[i], int32_t(i), int32_t(i)});
  return rows;
}

// The reference: on a fresh cache, a prefill of `prompt`, then `path` one token a step; the last step's
// logits.
std::vector<float> decode_path(Qwen3Model& m, const std::vector<int32_t>& prompt,
                               const std::vector<int32_t>& path, int32_t page_size, KvLayout layout,
                               bool mrope) {
  KvCache cache(m.config(), 64, page_size, layout, DType::bf16, Device::cpu());
  int32_t next_page = 3;  // another page assignment than the tree step's
  Pages pages{page_size, {}};
  const int32_t p0 = int32_t(prompt.size());
  std::vector<std::vector<float>> last =
      forward(m, cache, make_step({{&pages, prompt_rows(prompt), p0}}, page_size, next_page, mrope));
  for (size_t k = 0; k < path.size(); ++k) {
    const int32_t pos = p0 + int32_t(k);
    last =
        forward(m, cache, make_step({{&pages, {{path[k], pos, pos}}, pos + 1}}, page_size, next_page, mrope));
  }
  return last.back();
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << what << ": logit " << i << " " << got[i] << " vs " << want[i];
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
};

// After a prefill, a verify step over the root and n random draft nodes (window 1 + n), then a draft pass
// that adds `more` nodes below random earlier ones (its window holds the cached tree: W = 1 + n + more >
// q_len). Beside it in both steps runs a second sequence's plain decode (window 0). Every row's logits must
// be those of the plain step-by-step decode of its path.
void check_tree_steps(const ModelConfig& cfg, uint32_t seed, int32_t page_size, KvLayout layout, int32_t n,
                      int32_t more) {
  const bool mrope = !cfg.mrope_section.empty();
  LoadOptions o;
  o.seed = 7;
  auto m = Qwen3Model::create(cfg, nullptr, o);
  std::mt19937 rng(seed);
  const auto tok = [&] { return int32_t(rng() % uint32_t(cfg.vocab_size)); };
  std::vector<int32_t> prompt_a(9 + rng() % 5), prompt_b(4 + rng() % 7);
  for (auto& t : prompt_a) t = tok();
  for (auto& t : prompt_b) t = tok();
  const int32_t root = tok(), pa = int32_t(prompt_a.size()), pb = int32_t(prompt_b.size());
  DraftTree tree;
  for (int32_t i = 0; i < n; ++i) tree.add(int32_t(rng() % uint32_t(i + 1)) - 1, tok());

  KvCache cache(cfg, 64, page_size, layout, DType::bf16, Device::cpu());
  int32_t next_page = 0;
  Pages a{page_size, {}}, b{page_size, {}};
  forward(*m, cache,
          make_step({{&a, prompt_rows(prompt_a), pa}, {&b, prompt_rows(prompt_b), pb}}, page_size, next_page,
                    mrope));

  // Verify step: root and nodes 0 .. n-1; sequence b decodes one token beside it.
  std::vector<int32_t> b_path = {tok()};
  StepSeq verify{&a, {{root, pa, pa, 1}}, pa + 1 + n, 1 + n};
  for (int32_t i = 0; i < n; ++i)
    verify.rows.push_back({tree.token[size_t(i)], pa + tree.depth[size_t(i)], pa + 1 + i, tree.mask(i)});
  const auto got = forward(
      *m, cache, make_step({verify, {&b, {{b_path[0], pb, pb}}, pb + 1}}, page_size, next_page, mrope));
  ASSERT_EQ(got.size(), size_t(n + 2));
  expect_bitwise(got[0], decode_path(*m, prompt_a, {root}, page_size, layout, mrope), "root");
  for (int32_t i = 0; i < n; ++i)
    expect_bitwise(got[size_t(1 + i)],
                   decode_path(*m, prompt_a, tree.path(root, i), page_size, layout, mrope),
                   "node " + std::to_string(i) + " depth " + std::to_string(tree.depth[size_t(i)]));
  expect_bitwise(got[size_t(n + 1)], decode_path(*m, prompt_b, b_path, page_size, layout, mrope),
                 "plain decode");

  // Draft pass: `more` new nodes; the window spans the root and every node, the rows are the new ones.
  for (int32_t i = 0; i < more; ++i) tree.add(int32_t(rng() % uint32_t(n + i + 1)) - 1, tok());
  b_path.push_back(tok());
  const int32_t all = n + more;
  StepSeq draft{&a, {}, pa + 1 + all, 1 + all};
  for (int32_t i = n; i < all; ++i)
    draft.rows.push_back({tree.token[size_t(i)], pa + tree.depth[size_t(i)], pa + 1 + i, tree.mask(i)});
  const auto got2 =
      forward(*m, cache,
              make_step({draft, {&b, {{b_path[1], pb + 1, pb + 1}}, pb + 2}}, page_size, next_page, mrope));
  ASSERT_EQ(got2.size(), size_t(more + 1));
  for (int32_t i = n; i < all; ++i)
    expect_bitwise(got2[size_t(i - n)],
                   decode_path(*m, prompt_a, tree.path(root, i), page_size, layout, mrope),
                   "drafted node " + std::to_string(i) + " depth " + std::to_string(tree.depth[size_t(i)]));
  expect_bitwise(got2[size_t(more)], decode_path(*m, prompt_b, b_path, page_size, layout, mrope),
                 "plain decode 2");
}

}  // namespace

TEST(TreeModel, TreeStepLogitsAreEachPathsPlainDecode) {
  check_tree_steps(dense_config(), 1, 4, KvLayout::nhd, 9, 4);
  check_tree_steps(dense_config(), 2, 16, KvLayout::hnd, 12, 3);
  check_tree_steps(dense_config(), 3, 1, KvLayout::nhd, 5, 6);
}

TEST(TreeModel, MropeTextRowsAndMoeLayers) {
  check_tree_steps(vl_text_config(), 4, 4, KvLayout::hnd, 8, 3);
  check_tree_steps(moe_config(), 5, 8, KvLayout::nhd, 8, 3);
}
