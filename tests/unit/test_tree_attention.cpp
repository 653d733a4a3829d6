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
#include "tiny_model_config.h"
#include "tree_test_util.h"

using namespace kiln;
using ops::KvLayout;
using test_support::error_of;
using test_support::expect_contains;

namespace {

constexpr uint16_t kPoisonBits = 0x7fc1;  // a bf16 NaN: an output row left unwritten shows

using Problem = test::TreeProblem;
using SeqSpec = test::TreeSeqSpec;

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

// The tree problem of the specs (test::tree_problem_fields), bf16 values from seed + 1.
Problem tree_problem(const std::vector<SeqSpec>& specs, int64_t Hq, int64_t Hkv, int64_t D, uint32_t seed,
                     bool chain = false) {
  std::mt19937 rng(seed);
  Problem p = test::tree_problem_fields(specs, Hq, Hkv, D, rng, chain);
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
            EXPECT_LE(test::fp64_attention_error(p, p.k, p.v, out), std::ldexp(1.0, -7))
                << "seed " << seed << " Hq " << h.Hq;
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
  // Only tree graphs take trees: the graphs' batch copy refuses a tree for any other graph (which would run
  // its rows causally) and a tree graph's batch without masks, and copies the masks for a tree graph; a
  // uniform tree is a verify graph's shape (the runner picks the tree family), a one-row tree no decode
  // graph's.
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
  expect_contains(error_of([&] { copy_with_table_width(b, 1, 2, out); }),
                  {"token-tree", "without tree masks"});
  copy_with_table_width(b, 2, 3, out, true);
  EXPECT_EQ(out.tree_window, b.tree_window);
  EXPECT_EQ(out.tree_mask, b.tree_mask);
  EXPECT_EQ(out.page_table, (std::vector<int32_t>{0, 1, 0, 0, 0, 0}));
  EXPECT_TRUE(is_uniform_verify(b, 2));
  BatchDesc padded = b;  // padding sequences of a tree: causal, masks 0
  pad_batch(padded, 3, 2);
  EXPECT_EQ(padded.tree_window, (std::vector<int32_t>{2, 0, 0}));
  EXPECT_EQ(padded.tree_mask, (std::vector<uint64_t>{1, 3, 0, 0, 0, 0}));
  EXPECT_NO_THROW(padded.validate(16, 4));
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
  expect_contains(error_of([&] { copy_with_table_width(b, 1, 2, out, true); }), {"without tree_window"});
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
  return test::tiny_cpu_config(false);
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

// The reference: on a fresh cache, a prefill of `prompt`, then `path` one token a step; the last step's
// logits.
std::vector<float> decode_path(Qwen3Model& m, const std::vector<int32_t>& prompt,
                               const std::vector<int32_t>& path, int32_t page_size, KvLayout layout,
                               bool mrope) {
  KvCache cache(m.config(), 64, page_size, layout, DType::bf16, Device::cpu());
  int32_t next_page = 3;  // another page assignment than the tree step's
  test::Pages pages{page_size, {}};
  const int32_t p0 = int32_t(prompt.size());
  std::vector<std::vector<float>> last = test::step_logits(
      m, cache, test::make_step({{&pages, test::causal_rows(prompt), p0}}, page_size, next_page, mrope));
  for (size_t k = 0; k < path.size(); ++k) {
    const int32_t pos = p0 + int32_t(k);
    last = test::step_logits(
        m, cache, test::make_step({{&pages, {{path[k], pos, pos}}, pos + 1}}, page_size, next_page, mrope));
  }
  return last.back();
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << what << ": logit " << i << " " << got[i] << " vs " << want[i];
}

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
  test::DraftTree tree;
  for (int32_t i = 0; i < n; ++i) tree.add(int32_t(rng() % uint32_t(i + 1)) - 1, tok());

  KvCache cache(cfg, 64, page_size, layout, DType::bf16, Device::cpu());
  int32_t next_page = 0;
  test::Pages a{page_size, {}}, b{page_size, {}};
  test::step_logits(
      *m, cache,
      test::make_step({{&a, test::causal_rows(prompt_a), pa}, {&b, test::causal_rows(prompt_b), pb}},
                      page_size, next_page, mrope));

  // Verify step: root and nodes 0 .. n-1; sequence b decodes one token beside it.
  std::vector<int32_t> b_path = {tok()};
  test::StepSeq verify{&a, {{root, pa, pa, 1}}, pa + 1 + n, 1 + n};
  for (int32_t i = 0; i < n; ++i) verify.rows.push_back(tree.row(i, pa));
  const auto got = test::step_logits(
      *m, cache, test::make_step({verify, {&b, {{b_path[0], pb, pb}}, pb + 1}}, page_size, next_page, mrope));
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
  test::StepSeq draft{&a, {}, pa + 1 + all, 1 + all};
  for (int32_t i = n; i < all; ++i) draft.rows.push_back(tree.row(i, pa));
  const auto got2 = test::step_logits(
      *m, cache,
      test::make_step({draft, {&b, {{b_path[1], pb + 1, pb + 1}}, pb + 2}}, page_size, next_page, mrope));
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
