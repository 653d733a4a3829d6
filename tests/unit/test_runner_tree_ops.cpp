// The runner-level pieces of EAGLE-3 tree drafting, on the CPU backend (move_kv: test_runner_move_kv.cpp):
//   - EAGLE-3 top-k: Out::topk_* against a brute-force ranking of the draft's own logits, entry 0 the top-1,
//     log-probabilities bitwise the header's f32 order and within f32 rounding of fp64; ties and NaN;
//     set_topk's bounds; the runner's set_draft_topk.
//   - EAGLE-3 token trees: a draft pass over a tree's frontier gives each row, bit for bit, what a chain pass
//     over its path gives (needs the CPU attention's tree masks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "eagle3_test_util.h"
#include "kiln/error.h"
#include "model/eagle3_model.h"
#include "model/kv_cache.h"
#include "model/qwen3.h"
#include "ops/argmax.h"
#include "runner_tree_test_util.h"
#include "runtime/fake_runner.h"
#include "runtime/qwen3_runner.h"
#include "runtime/tp_command.h"
#include "runtime/tp_runner.h"
#include "tiny_model_config.h"

namespace kiln {
namespace {

using namespace tree_ops;  // NOLINT: the shared fixtures (runner_tree_test_util.h)

// ---------------------------------------------------------------------------------------------------------
// EAGLE-3 top-k

// The ranking key of ops::topk_rows and ops::argmax_rows: NaN as -inf.
float rank_key(float x) {
  return x == x ? x : -std::numeric_limits<float>::infinity();
}

// Out::topk_* of R rows against a brute force over Out::logits: a full sort by (logit desc, id asc), and the
// log-softmax in fp64 (within f32 rounding) and in the header's f32 order (bitwise). Counts tied pairs seen
// inside the top k + 1.
int check_topk(const Eagle3Model::Out& o, int k, int64_t Dv) {
  const int64_t R = int64_t(o.tokens.size());
  EXPECT_EQ(o.logits.size(), size_t(R * Dv));
  EXPECT_EQ(o.topk_tokens.size(), size_t(R * k));
  EXPECT_EQ(o.topk_logprobs.size(), size_t(R * k));
  int ties = 0;
  for (int64_t r = 0; r < R; ++r) {
    const float* x = o.logits.data() + r * Dv;
    std::vector<int32_t> ids(static_cast<size_t>(Dv));
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return rank_key(x[a]) > rank_key(x[b]) || (rank_key(x[a]) == rank_key(x[b]) && a < b);
    });
    for (int i = 0; i < k && i + 1 < Dv; ++i) ties += x[ids[size_t(i)]] == x[ids[size_t(i + 1)]] ? 1 : 0;
    double mx = -INFINITY;
    for (int64_t j = 0; j < Dv; ++j) mx = std::max(mx, double(x[j]));
    double sum = 0;
    for (int64_t j = 0; j < Dv; ++j) sum += std::exp(double(x[j]) - mx);
    const float m = x[ids[0]];
    float s = 0.0f;
    for (int64_t j = 0; j < Dv; ++j) s += std::exp(x[j] - m);
    EXPECT_EQ(o.topk_tokens[size_t(r * k)], o.tokens[size_t(r)])
        << "row " << r << ": entry 0 is not the top-1";
    for (int i = 0; i < k; ++i) {
      const int32_t id = ids[size_t(i)];
      EXPECT_EQ(o.topk_tokens[size_t(r * k + i)], 2 * id + 1) << "row " << r << " entry " << i;
      const float got = o.topk_logprobs[size_t(r * k + i)];
      const double lp = double(x[id]) - mx - std::log(sum);
      EXPECT_NEAR(got, lp, 1e-5 * std::max(1.0, std::fabs(lp))) << "row " << r << " entry " << i;
      const float f32 = (x[id] - m) - std::log(s);
      EXPECT_EQ(std::memcmp(&got, &f32, 4), 0)
          << "row " << r << " entry " << i << ": " << got << " vs " << f32;
      if (i > 0) {
        EXPECT_LE(got, o.topk_logprobs[size_t(r * k + i - 1)]);
      }
    }
  }
  return ties;
}

struct DraftFixture {
  std::unique_ptr<Qwen3Model> target = tiny_model();
  std::unique_ptr<Eagle3Model> draft;
  std::vector<bf16_t> feat;
  Tensor features;
  DraftFixture(int64_t T, int32_t pages = 16, int32_t page_size = 4) {
    draft = Eagle3Model::load(draft_dir(), *target);
    draft->allocate_kv(pages, page_size, ops::KvLayout::nhd);
    feat = test_support::random_bf16(size_t(T * 3 * kHidden), 21, -1.5f, 1.5f);
    features = Tensor(feat.data(), DType::bf16, {T, 3 * kHidden}, Device::cpu());
  }
};

// Two sequences of 7 and 5 rows, every row a logit row.
BatchDesc two_sequences() {
  BatchDesc b;
  b.page_size = 4;
  b.pages_stride = 2;
  b.cu_q = {0};
  for (int32_t s = 0; s < 2; ++s) {
    const int32_t n = s == 0 ? 7 : 5;
    for (int32_t p = 0; p < n; ++p) {
      b.tokens.push_back(int32_t((s * 53 + p * 29 + 3) % kVocab));
      b.positions.push_back(p);
      b.slot_mapping.push_back(int64_t(1 + 2 * s + p / 4) * 4 + p % 4);
      b.logit_rows.push_back(b.cu_q.back() + p);
    }
    b.cu_q.push_back(b.cu_q.back() + n);
    b.kv_lens.push_back(n);
    b.page_table.insert(b.page_table.end(), {1 + 2 * s, 2 + 2 * s});
  }
  return b;
}

TEST(Eagle3TopK, RanksTheDraftLogitsAndEntryZeroIsTheTopOne) {
  DraftFixture fx(12);
  const BatchDesc b = two_sequences();
  std::vector<int32_t> rows(12);
  std::iota(rows.begin(), rows.end(), 0);
  fx.draft->set_return_logits(true);
  Eagle3Model::Out top1;
  fx.draft->forward_features(b, fx.features, rows, &top1);
  EXPECT_EQ(fx.draft->topk(), 1);
  EXPECT_TRUE(top1.topk_tokens.empty() && top1.topk_logprobs.empty()) << "k = 1 fills no top-k";
  ASSERT_EQ(top1.logits.size(), size_t(12 * kDraftVocab));
  int ties = 0;
  for (int k : {2, 5, 16}) {
    SCOPED_TRACE("k " + std::to_string(k));
    fx.draft->set_topk(k);
    Eagle3Model::Out o;
    o.topk_tokens.assign(999, -7);  // poison: the pass must size and fill them
    o.topk_logprobs.assign(999, NAN);
    fx.draft->forward_features(b, fx.features, rows, &o);
    EXPECT_EQ(o.tokens, top1.tokens) << "top-k changed the top-1 tokens";
    EXPECT_TRUE(same_bits(o.hidden, top1.hidden));
    EXPECT_TRUE(same_bits(o.logits, top1.logits));
    ties += check_topk(o, k, kDraftVocab);
    // A chain row (forward_hidden) ranks too.
    Eagle3Model::Out h;
    const std::vector<float> last(o.hidden.begin() + 6 * 64, o.hidden.begin() + 7 * 64);
    fx.draft->forward_hidden(test::one_sequence_batch({o.tokens[6]}, 7, {0}, 4), last, &h);
    check_topk(h, k, kDraftVocab);
  }
  std::printf("  %d tied neighbours inside the top k (bf16-rounded logits)\n", ties);
  // Without return_logits the top k still comes (its logits stay inside).
  fx.draft->set_return_logits(false);
  Eagle3Model::Out o;
  fx.draft->forward_features(b, fx.features, rows, &o);
  EXPECT_TRUE(o.logits.empty());
  EXPECT_EQ(o.topk_tokens.size(), size_t(12 * 16));
}

// Planted ties, NaN and -inf through ops::topk_rows directly; entry 0 against ops::argmax_rows on the same
// rows.
TEST(Eagle3TopK, TiesGoToTheLowerIdAndNanRanksAsMinusInf) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const int64_t Dv = 6;
  const std::vector<float> x = {
      1.0f, 3.0f, 3.0f,
      2.0f, 3.0f, 0.5f,  // three equal maxima: 1, 2, 4
      nan,  -1.f, nan,
      5.0f, -inf, -1.f,  // NaN as -inf: 3, 1, 5, then 0, 2 and 4 (-inf, NaN, -inf tie by id)
      -inf, nan,  -inf,
      nan,  -inf, -inf,  // nothing above -inf: ids ascending
  };
  const std::vector<int64_t> d2t = {10, 10, 10, 10, 10, 10};
  const int k = 6;
  std::vector<int32_t> tok(3 * k);
  std::vector<float> lp(3 * k);
  test::host_topk(x.data(), 3, Dv, k, d2t.data(), tok.data(), lp.data());
  const std::vector<int32_t> want = {11, 12, 14, 13, 10, 15, 13, 11, 15, 10, 12, 14, 10, 11, 12, 13, 14, 15};
  EXPECT_EQ(tok, want);
  std::vector<int32_t> arg(3);
  ops::argmax_rows(Tensor(const_cast<float*>(x.data()), DType::f32, {3, Dv}, Device::cpu()),
                   Tensor(const_cast<int64_t*>(d2t.data()), DType::i64, {Dv}, Device::cpu()),
                   Tensor(arg.data(), DType::i32, {3}, Device::cpu()));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(tok[size_t(r * k)], arg[size_t(r)]) << "row " << r;
  // Row 0's equal logits get equal log-probabilities, which sum with the rest to 1.
  EXPECT_EQ(lp[0], lp[1]);
  EXPECT_EQ(lp[1], lp[2]);
  double total = 0;
  for (int i = 0; i < k; ++i) total += std::exp(double(lp[size_t(i)]));
  EXPECT_NEAR(total, 1.0, 1e-6);
  for (int i = 0; i < k; ++i) EXPECT_TRUE(std::isnan(lp[size_t(k + i)])) << "a row with NaN: NaN log-probs";
  EXPECT_THROW(test::host_topk(x.data(), 1, Dv, 7, d2t.data(), tok.data(), lp.data()), Error);
}

TEST(Eagle3TopK, SetTopkBoundsAndTheRunnersPlumbing) {
  DraftFixture fx(1);
  for (int bad : {0, -1, 17})
    EXPECT_NE(error_of([&] { fx.draft->set_topk(bad); }).find("must be in [1, 16]"), std::string::npos)
        << bad;
  EXPECT_EQ(fx.draft->topk(), 1);
  EXPECT_NO_THROW(fx.draft->set_topk(16));
  EXPECT_NO_THROW(fx.draft->set_topk(1));
  auto small = Eagle3Model::load(draft_dir(8), *fx.target);
  EXPECT_NE(error_of([&] { small->set_topk(9); }).find("exceeds the draft vocabulary of 8"),
            std::string::npos);
  EXPECT_NO_THROW(small->set_topk(8));

  auto plain = make_runner(DType::bf16, ops::KvLayout::nhd, false);
  EXPECT_NO_THROW(plain->set_draft_topk(1));
  EXPECT_THROW(plain->set_draft_topk(2), Error);
  auto r = make_runner(DType::bf16, ops::KvLayout::nhd, true);
  EXPECT_THROW(r->set_draft_topk(17), Error);
  r->set_draft_topk(4);
  ModelRunner::DraftOut o;
  r->draft_from_hidden(seq_step({5, 9}, 0, plain_ctx(2)), std::vector<float>(2 * 64, 0.25f), &o);
  ASSERT_EQ(o.tokens.size(), 1u);
  ASSERT_EQ(o.topk_tokens.size(), 4u);
  ASSERT_EQ(o.topk_logprobs.size(), 4u);
  EXPECT_EQ(o.topk_tokens[0], o.tokens[0]);
  for (int i = 1; i < 4; ++i) EXPECT_LE(o.topk_logprobs[size_t(i)], o.topk_logprobs[size_t(i - 1)]);
  r->set_draft_topk(1);
  r->draft_from_hidden(seq_step({5, 9}, 0, plain_ctx(2)), std::vector<float>(2 * 64, 0.25f), &o);
  EXPECT_TRUE(o.topk_tokens.empty());
}

// ---------------------------------------------------------------------------------------------------------
// EAGLE-3 token trees (page size 4; position p in page 1 + p / 4)

// A pass of one sequence: rows at `positions` (rope) written at context positions kv_len - n .. kv_len - 1, a
// tree window of W (0: causal) with the rows' masks, every row a logit row.
BatchDesc tree_pass(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions, int32_t kv_len,
                    int32_t W, const std::vector<uint64_t>& masks) {
  BatchDesc b;
  b.page_size = 4;
  const int32_t n = int32_t(tokens.size());
  for (int32_t j = 0; j < n; ++j) {
    const int32_t ctx = kv_len - n + j;
    b.tokens.push_back(tokens[size_t(j)]);
    b.positions.push_back(positions[size_t(j)]);
    b.slot_mapping.push_back(int64_t(1 + ctx / 4) * 4 + ctx % 4);
    b.logit_rows.push_back(j);
  }
  b.cu_q = {0, n};
  b.kv_lens = {kv_len};
  b.seq_ids = {1};
  b.pages_stride = (kv_len + 3) / 4;
  for (int32_t p = 0; p < b.pages_stride; ++p) b.page_table.push_back(1 + p);
  if (W > 0) {
    b.tree_window = {W};
    b.tree_mask = masks;
  }
  return b;
}

// A tree below the last history row (position 5): depth 1 nodes 0, 1; depth 2 nodes 2, 3 (children of 0) and
// 4 (of 1); depth 3 node 5 (of 3). Node i sits at window index i (context position 6 + i). Pass d drafts
// depth d's nodes from their parents' outputs. A chain pass over each node's path (its ancestors at positions
// 6 .., written in place) must give the node's row the same bits: outputs and top-1 token.
TEST(Eagle3Tree, FrontierRowsGetTheOutputsOfAChainOverTheirPath) {
  const int32_t n_hist = 6;
  DraftFixture tree(n_hist), chain(n_hist);
  const std::vector<int32_t> hist_tokens = some_tokens(n_hist, 5);
  std::vector<int32_t> rows(static_cast<size_t>(n_hist));
  std::iota(rows.begin(), rows.end(), 0);
  Eagle3Model::Out h1, h2;
  tree.draft->forward_features(tree_pass(hist_tokens, {0, 1, 2, 3, 4, 5}, n_hist, 0, {}), tree.features, rows,
                               &h1);
  chain.draft->forward_features(tree_pass(hist_tokens, {0, 1, 2, 3, 4, 5}, n_hist, 0, {}), chain.features,
                                rows, &h2);
  ASSERT_TRUE(same_bits(h1.hidden, h2.hidden));
  const int64_t H = 64;
  const std::vector<float> root(h1.hidden.end() - H, h1.hidden.end());

  const std::vector<int32_t> parent = {-1, -1, 0, 0, 1, 3}, depth = {1, 1, 2, 2, 2, 3};
  const std::vector<int32_t> token = {11, 42, 7, 99, 123, 250};
  std::vector<std::vector<float>> out(6);  // each node's midlayer output
  std::vector<int32_t> top1(6);
  const auto mask_of = [&](int32_t i) {
    uint64_t m = 0;
    for (int32_t a = i; a >= 0; a = parent[size_t(a)]) m |= uint64_t(1) << a;
    return m;
  };
  // Tree passes: depth d's nodes are the window's last rows; the window holds every node so far.
  for (int32_t d = 1, first = 0; d <= 3; ++d) {
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < 6; ++i)
      if (depth[size_t(i)] == d) ids.push_back(i);
    ASSERT_EQ(ids.front(), first);
    const int32_t W = ids.back() + 1;
    std::vector<int32_t> toks, pos;
    std::vector<uint64_t> masks;
    std::vector<float> hidden;
    for (int32_t i : ids) {
      toks.push_back(token[size_t(i)]);
      pos.push_back(n_hist + d - 1);
      masks.push_back(mask_of(i));
      const std::vector<float>& in = parent[size_t(i)] < 0 ? root : out[size_t(parent[size_t(i)])];
      hidden.insert(hidden.end(), in.begin(), in.end());
    }
    Eagle3Model::Out o;
    tree.draft->forward_hidden(tree_pass(toks, pos, n_hist + W, W, masks), hidden, &o);
    for (size_t j = 0; j < ids.size(); ++j) {
      out[size_t(ids[j])].assign(o.hidden.begin() + int64_t(j) * H, o.hidden.begin() + int64_t(j + 1) * H);
      top1[size_t(ids[j])] = o.tokens[j];
    }
    first = W;
  }
  // Chain passes over each frontier node's path.
  for (int32_t leaf = 0; leaf < 6; ++leaf) {
    SCOPED_TRACE("node " + std::to_string(leaf));
    std::vector<int32_t> path;
    for (int32_t a = leaf; a >= 0; a = parent[size_t(a)]) path.insert(path.begin(), a);
    std::vector<int32_t> toks, pos;
    std::vector<float> hidden;
    for (size_t j = 0; j < path.size(); ++j) {
      toks.push_back(token[size_t(path[j])]);
      pos.push_back(n_hist + int32_t(j));
      const std::vector<float>& in = j == 0 ? root : out[size_t(path[j - 1])];
      hidden.insert(hidden.end(), in.begin(), in.end());
    }
    Eagle3Model::Out o;
    chain.draft->forward_hidden(tree_pass(toks, pos, n_hist + int32_t(path.size()), 0, {}), hidden, &o);
    for (size_t j = 0; j < path.size(); ++j) {
      const std::vector<float> row(o.hidden.begin() + int64_t(j) * H, o.hidden.begin() + int64_t(j + 1) * H);
      EXPECT_TRUE(same_bits(row, out[size_t(path[j])])) << "path row " << j << " (node " << path[j] << ")";
      EXPECT_EQ(o.tokens[j], top1[size_t(path[j])]) << "path row " << j;
    }
  }
}

// A chain of passes takes no tree.
TEST(Eagle3Tree, ChainPassesRefuseATree) {
  DraftFixture fx(1);
  BatchDesc b = tree_pass({3}, {0}, 1, 1, {1});
  std::vector<std::vector<int32_t>> tokens;
  EXPECT_NE(error_of([&] {
              fx.draft->forward_chain({b}, std::vector<float>(64, 0.0f), &tokens);
            }).find("take no token tree"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
