// EAGLE-3 top-k drafting on CUDA. ops::topk_rows on CUDA against its CPU oracle (the same op on host rows)
// on the same logits: random rows with planted ties (inside and across the top k), NaN, -inf, +inf and signed
// zeros, draft vocabularies of 2, 1000, 32000 and 151936, k 1 .. 16, up to 300 rows, a row stride wider than
// the row, with and without d2t; outputs poisoned first. Tokens equal; log-probabilities within
// ops/argmax.h's tolerance (1e-5 max(1, |lp|) of the f64 log-softmax, and of the CPU's plus the CPU's own
// drift). Then the draft's passes with k > 1 on CUDA against the same draft on the CPU backend: the device's
// top k is the CPU oracle's of its own logits (copied back), and it agrees with the CPU backend's wherever
// the CPU's logit margins are wider than twice the largest logit difference between the backends (the rule
// below), token-tree passes included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../unit/eagle3_test_util.h"
#include "eagle3_cuda_util.h"
#include "model/eagle3_model.h"
#include "ops/argmax.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct LogprobDrift {
  double cuda_vs_cpu = 0, cpu_vs_exact = 0, cuda_vs_exact = 0;
};

// got (CUDA) against want (CPU) for R rows of x [R, V] (contiguous), k entries a row: tokens equal;
// log-probabilities NaN together, equal where infinite, else within ops/argmax.h's tolerance of the f64
// log-softmax lp (m: the top entry's logit, as the contract's): |CUDA - lp| <= 1e-5 max(1, |lp|) and
// |CUDA - CPU| <= 1e-5 max(1, |lp|) + |CPU - lp|.
void check_topk(const std::vector<float>& x, int64_t R, int64_t V, int k, const std::vector<int64_t>& d2t,
                const std::vector<int32_t>& got_tok, const std::vector<float>& got_lp,
                const std::vector<int32_t>& want_tok, const std::vector<float>& want_lp, LogprobDrift* d) {
  ASSERT_EQ(got_tok, want_tok);
  int64_t most = 0;  // the tests' d2t tables are injective: invert them
  for (int64_t j = 0; j < V; ++j) most = std::max(most, j + d2t[size_t(j)]);
  std::vector<int32_t> draft_id(size_t(most + 1), -1);
  for (int64_t j = 0; j < V; ++j) draft_id[size_t(j + d2t[size_t(j)])] = int32_t(j);
  for (int64_t r = 0; r < R; ++r) {
    const float* row = x.data() + r * V;
    const double m = row[draft_id[size_t(want_tok[size_t(r * k)])]];
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(double(row[j]) - m);
    const double log_s = std::log(sum);
    for (int i = 0; i < k; ++i) {
      const size_t at = size_t(r * k + i);
      const float g = got_lp[at], c = want_lp[at];
      if (std::isnan(c) || std::isnan(g)) {
        EXPECT_TRUE(std::isnan(c) && std::isnan(g))
            << "row " << r << " entry " << i << ": " << g << " vs " << c;
        continue;
      }
      if (std::isinf(c) || std::isinf(g)) {
        EXPECT_EQ(g, c) << "row " << r << " entry " << i;
        continue;
      }
      const double lp = (double(row[draft_id[size_t(want_tok[at])]]) - m) - log_s;
      const double tol = 1e-5 * std::max(1.0, std::fabs(lp)), cpu_drift = std::fabs(double(c) - lp);
      EXPECT_LE(std::fabs(double(g) - lp), tol) << "row " << r << " entry " << i << ": CUDA vs f64";
      EXPECT_LE(std::fabs(double(g) - double(c)), tol + cpu_drift) << "row " << r << " entry " << i;
      d->cuda_vs_cpu = std::max(d->cuda_vs_cpu, std::fabs(double(g) - double(c)));
      d->cpu_vs_exact = std::max(d->cpu_vs_exact, cpu_drift);
      d->cuda_vs_exact = std::max(d->cuda_vs_exact, std::fabs(double(g) - lp));
    }
  }
}

// Row r of V logits, planted by r % 7.
void fill_row(float* row, int64_t V, int64_t r, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  switch (r % 7) {
    case 0:  // N(0, 3^2): a wide sum of exponentials (the CPU's ascending sum drifts most here)
      for (int64_t i = 0; i < V; ++i) row[i] = nd(rng);
      break;
    case 1:  // multiples of 1/8: many equal logits, inside and across the top k
      for (int64_t i = 0; i < V; ++i) row[i] = float(int(u(rng) * 8)) / 8.0f;
      break;
    case 2:  // the maximum at 19 columns spread over the row (more equal maxima than any k), the rest below
      for (int64_t i = 0; i < V; ++i) row[i] = float(int(u(rng) * 8)) / 8.0f;
      for (int64_t j = 0; j < 19; ++j) row[(j * 7919 + r) % V] = 6.0f;
      break;
    case 3:  // NaN at every 7th column (ranked as -inf; NaN log-probabilities)
      for (int64_t i = 0; i < V; ++i) row[i] = i % 7 == 3 ? kNan : nd(rng);
      break;
    case 4:  // NaN and -inf only: every key -inf, ids ascending; NaN log-probabilities
      for (int64_t i = 0; i < V; ++i) row[i] = (i + r) % 3 ? -kInf : kNan;
      break;
    case 5:  // -inf but for a few +0 and -0 (equal keys: ids ascending) and one -1: finite log-probs
      for (int64_t i = 0; i < V; ++i) row[i] = -kInf;
      for (int64_t j = 0; j < 9; ++j) row[(j * 104729 + 3 * r) % V] = j % 2 ? -0.0f : 0.0f;
      row[(r * 31) % V] = -1.0f;
      break;
    default:  // +inf at one column: the top-1, NaN log-probabilities
      for (int64_t i = 0; i < V; ++i) row[i] = nd(rng);
      row[(r * 13) % V] = kInf;
      break;
  }
}

// R rows of V logits (row stride ld) through ops::topk_rows on CUDA and on the CPU, every k.
void check_op(int64_t R, int64_t V, int64_t ld, bool offsets, uint32_t seed) {
  SCOPED_TRACE("R " + std::to_string(R) + " V " + std::to_string(V) + " ld " + std::to_string(ld) +
               (offsets ? " with d2t" : " without d2t"));
  std::mt19937 rng(seed);
  std::vector<float> x(size_t(R * V)), strided(size_t(R * ld), 1e30f);  // columns past V: never read
  for (int64_t r = 0; r < R; ++r) {
    fill_row(x.data() + r * V, V, r, rng);
    std::copy_n(x.data() + r * V, V, strided.data() + r * ld);
  }
  std::vector<int64_t> d2t(size_t(V), 0);  // zeros stand for "no offsets" on the CPU side
  if (offsets)
    for (int64_t i = 0; i < V; ++i) d2t[size_t(i)] = i + 5;  // target id 2 i + 5
  const Buffer dx = test::to_device(strided), dd = test::to_device(d2t);
  LogprobDrift drift;
  for (int k = 1; k <= std::min<int64_t>(16, V); ++k) {
    SCOPED_TRACE("k " + std::to_string(k));
    std::vector<int32_t> want_tok(size_t(R * k));
    std::vector<float> want_lp(size_t(R * k));
    test::host_topk(x.data(), R, V, k, d2t.data(), want_tok.data(), want_lp.data());
    Buffer tok(size_t(R * k) * 4, Device::cuda());
    test::poison(tok);                                                           // -1: no token
    const Buffer lp = test::to_device(std::vector<float>(size_t(R * k), 3.0f));  // no log-prob is above 0
    ops::topk_rows(Tensor::strided(dx.data(), DType::f32, {R, V}, {ld, 1}, Device::cuda()),
                   offsets ? Tensor(dd.data(), DType::i64, {V}, Device::cuda()) : Tensor(), k,
                   Tensor(tok.data(), DType::i32, {R, k}, Device::cuda()),
                   Tensor(lp.data(), DType::f32, {R, k}, Device::cuda()));
    check_topk(x, R, V, k, d2t, test::to_host<int32_t>(tok, size_t(R * k)),
               test::to_host<float>(lp, size_t(R * k)), want_tok, want_lp, &drift);
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::printf("  V %6lld: largest |CUDA - CPU| %.2e, |CPU - f64| %.2e, |CUDA - f64| %.2e\n", (long long)V,
              drift.cuda_vs_cpu, drift.cpu_vs_exact, drift.cuda_vs_exact);
}

TEST(CudaTopkRows, EqualsTheCpuOracle) {
  KILN_REQUIRE_GPU();
  check_op(7, 2, 2, true, 1);
  check_op(300, 1000, 1003, true, 2);
  check_op(300, 1000, 1000, false, 3);
  check_op(70, 32000, 32000, true, 4);
  check_op(14, 151936, 151936, true, 5);
}

TEST(CudaTopkRows, RefusesBadArguments) {
  KILN_REQUIRE_GPU();
  const Buffer x(4 * 8 * 4, Device::cuda()), tok(4 * 16 * 4, Device::cuda()), lp(4 * 16 * 4, Device::cuda());
  const Tensor logits(x.data(), DType::f32, {4, 8}, Device::cuda());
  const auto run = [&](int k, int64_t cols) {
    ops::topk_rows(logits, Tensor(), k, Tensor(tok.data(), DType::i32, {4, cols}, Device::cuda()),
                   Tensor(lp.data(), DType::f32, {4, cols}, Device::cuda()));
  };
  EXPECT_THROW(run(0, 0), Error);
  EXPECT_THROW(run(9, 9), Error);  // more than the row's 8 columns
  EXPECT_THROW(run(3, 4), Error);  // outputs not [R, k]
  EXPECT_NO_THROW(run(8, 8));
}

// ---- The draft's passes with k > 1: CUDA against the CPU backend.

// Each logit row of a pass on both backends: the CUDA pass's top k is the CPU oracle's of its own logits
// (tokens equal, log-probabilities within the tolerance) with entry 0 its top-1 token; against the CPU
// backend's pass, with e the largest |logit difference| between the two: the top-1 tokens equal where the
// CPU's top two logits are more than 2e apart, and the top-k sets of target ids equal where the CPU's k-th
// and (k + 1)-th logits are (no logit moved more than e, so no pair further apart than 2e can swap). Returns
// the rows whose top-1 tokens differ.
int check_pass(const Eagle3Model::Out& gpu, const Eagle3Model::Out& cpu, int k, int64_t Dv,
               const std::vector<int64_t>& d2t) {
  const int64_t R = int64_t(gpu.tokens.size());
  EXPECT_EQ(cpu.tokens.size(), size_t(R));
  EXPECT_EQ(gpu.logits.size(), size_t(R * Dv));
  EXPECT_EQ(gpu.topk_tokens.size(), size_t(R * k));
  std::vector<int32_t> want_tok(size_t(R * k));
  std::vector<float> want_lp(size_t(R * k));
  test::host_topk(gpu.logits.data(), R, Dv, k, d2t.data(), want_tok.data(), want_lp.data());
  LogprobDrift drift;
  check_topk(gpu.logits, R, Dv, k, d2t, gpu.topk_tokens, gpu.topk_logprobs, want_tok, want_lp, &drift);
  for (int64_t r = 0; r < R; ++r) EXPECT_EQ(gpu.tokens[size_t(r)], gpu.topk_tokens[size_t(r * k)]) << r;
  double e = 0;
  for (size_t i = 0; i < gpu.logits.size(); ++i)
    e = std::max(e, std::fabs(double(gpu.logits[i]) - cpu.logits[i]));
  int differ = 0, top1_checked = 0, sets_checked = 0;
  for (int64_t r = 0; r < R; ++r) {
    const float* c = cpu.logits.data() + r * Dv;
    std::vector<int32_t> ids(static_cast<size_t>(Dv));
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(),
              [&](int32_t a, int32_t b) { return c[a] > c[b] || (c[a] == c[b] && a < b); });
    differ += gpu.tokens[size_t(r)] != cpu.tokens[size_t(r)] ? 1 : 0;
    if (Dv > 1 && double(c[ids[0]]) - c[ids[1]] > 2 * e) {
      ++top1_checked;
      EXPECT_EQ(gpu.tokens[size_t(r)], cpu.tokens[size_t(r)]) << "row " << r << ": a margin wider than 2e";
    }
    if (k<Dv&& double(c[ids[size_t(k - 1)]]) - c[ids[size_t(k)]]> 2 * e) {
      ++sets_checked;
      std::vector<int32_t> g(gpu.topk_tokens.begin() + r * k, gpu.topk_tokens.begin() + (r + 1) * k),
          w(cpu.topk_tokens.begin() + r * k, cpu.topk_tokens.begin() + (r + 1) * k);
      std::sort(g.begin(), g.end());
      std::sort(w.begin(), w.end());
      EXPECT_EQ(g, w) << "row " << r << ": the top-" << k << " sets across a boundary wider than 2e";
    }
  }
  std::printf(
      "  k %2d: %lld rows, largest logit difference e %.3g; top-1 checked on %d rows, top-k sets on %d\n", k,
      (long long)R, e, top1_checked, sets_checked);
  return differ;
}

BatchDesc seq_batch(const std::vector<int32_t>& tokens, int32_t begin, std::vector<int32_t> logit_rows) {
  return test::one_sequence_batch(tokens, begin, std::move(logit_rows), 16);
}

struct TwoBackends {
  explicit TwoBackends(const char* name, int64_t draft_vocab) : Dv(draft_vocab) {
    const fs::path dir = test::eagle3_scratch() / name;
    test::write_eagle3_draft(dir, test::eagle3_draft_shape(draft_vocab, true));
    cpu = Eagle3Model::load(dir.string(), *cpu_target);
    gpu = Eagle3Model::load(dir.string(), *gpu_target);
    cpu->allocate_kv(8, 16, ops::KvLayout::nhd);
    gpu->allocate_kv(8, 16, ops::KvLayout::hnd);
    for (Eagle3Model* m : {cpu.get(), gpu.get()}) m->set_return_logits(true);
    for (int64_t i = 0; i < Dv; ++i) d2t.push_back(i + 1);  // write_eagle3_draft's default: 2 i + 1
  }
  // An extend pass over the first T positions (feature rows 0 .. T - 1, every row a logit row).
  void extend(int64_t T, Eagle3Model::Out* c, Eagle3Model::Out* g) {
    const int64_t F = 3 * 256;
    std::mt19937 rng(4);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<bf16_t> feat(size_t(T * F));
    for (bf16_t& v : feat) v = f32_to_bf16(nd(rng));
    const Buffer dev_feat = test::to_device(feat);
    std::vector<int32_t> tokens, rows;
    for (int64_t t = 0; t < T; ++t) {
      tokens.push_back(int32_t((t * 41 + 7) % 500));
      rows.push_back(int32_t(t));
    }
    cpu->forward_features(seq_batch(tokens, 0, rows), Tensor(feat.data(), DType::bf16, {T, F}, Device::cpu()),
                          rows, c);
    gpu->forward_features(seq_batch(tokens, 0, rows),
                          Tensor(dev_feat.data(), DType::bf16, {T, F}, Device::cuda()), rows, g);
  }
  int64_t Dv;
  std::vector<int64_t> d2t;
  std::unique_ptr<Qwen3Model> cpu_target = test::eagle3_target(Device::cpu());
  std::unique_ptr<Qwen3Model> gpu_target = test::eagle3_target(Device::cuda());
  std::unique_ptr<Eagle3Model> cpu, gpu;
};

// An extend pass of 21 rows and a chain row after it (forward_hidden), each k on both backends.
TEST(CudaEagle3Topk, DraftPassesRankOnTheDeviceAsTheCpuBackend) {
  KILN_REQUIRE_GPU();
  TwoBackends b("draft_topk", 64);
  const int64_t T = 21, H = 256;
  for (int k : {2, 3, 8, 16}) {
    SCOPED_TRACE("k " + std::to_string(k));
    b.cpu->set_topk(k);
    b.gpu->set_topk(k);
    Eagle3Model::Out c, g;
    g.topk_tokens.assign(999, -7);  // poison: the pass must size and fill them
    g.topk_logprobs.assign(999, NAN);
    b.extend(T, &c, &g);
    ASSERT_EQ(g.topk_tokens.size(), size_t(T * k));
    const int differ = check_pass(g, c, k, b.Dv, b.d2t);
    // Near ties of the top two may flip under rounding (as in test_cuda_eagle3's top-1 check).
    EXPECT_LE(differ, T / 5) << "top-1 tokens of " << T << " rows";
    // A chain row from the CPU's last output, the same input on both.
    const std::vector<float> last(c.hidden.end() - H, c.hidden.end());
    Eagle3Model::Out hc, hg;
    b.cpu->forward_hidden(seq_batch({c.tokens.back()}, int32_t(T), {0}), last, &hc);
    b.gpu->forward_hidden(seq_batch({c.tokens.back()}, int32_t(T), {0}), last, &hg);
    check_pass(hg, hc, k, b.Dv, b.d2t);
  }
  // Back to k = 1: no top k, the top-1 tokens as before.
  b.gpu->set_topk(1);
  b.cpu->set_topk(1);
  Eagle3Model::Out c, g;
  b.extend(T, &c, &g);
  EXPECT_TRUE(g.topk_tokens.empty() && g.topk_logprobs.empty());
  std::vector<int32_t> want(static_cast<size_t>(T));
  for (int64_t r = 0; r < T; ++r) {
    const float* x = g.logits.data() + r * b.Dv;
    want[size_t(r)] = int32_t(2 * (std::max_element(x, x + b.Dv) - x) + 1);  // no NaN here
  }
  EXPECT_EQ(g.tokens, want);
}

// A token tree's passes (forward_hidden with tree_window / tree_mask) on both backends with k = 4: after 6
// history rows, depth 1 = three siblings under the last history row (window 3), depth 2 = a child of node 0
// and one of node 2 (window 5, masks wider than the pass). Each node's input is the CPU's output of its
// parent, on both backends: the top k as above, the depth-2 outputs within bf16 tolerance.
TEST(CudaEagle3Topk, TreePassesRankOnTheDeviceAsTheCpuBackend) {
  KILN_REQUIRE_GPU();
  TwoBackends b("draft_topk_tree", 64);
  const int k = 4;
  const int64_t H = 256;
  const int32_t n_hist = 6;
  b.cpu->set_topk(k);
  b.gpu->set_topk(k);
  Eagle3Model::Out c0, g0;
  b.extend(n_hist, &c0, &g0);
  const std::vector<float> root(c0.hidden.end() - H, c0.hidden.end());
  // One pass: rows at rotary position `pos`, written at context positions kv_len - n .., every row a logit
  // row.
  const auto tree_pass = [](const std::vector<int32_t>& tokens, int32_t pos, int32_t kv_len, int32_t W,
                            const std::vector<uint64_t>& masks) {
    const int32_t n = int32_t(tokens.size());
    BatchDesc p = test::one_sequence_batch(tokens, kv_len - n, {}, 16);
    for (int32_t j = 0; j < n; ++j) {
      p.positions[size_t(j)] = pos;
      p.logit_rows.push_back(j);
    }
    p.tree_window = {W};
    p.tree_mask = masks;
    return p;
  };
  Eagle3Model::Out c1, g1;
  const BatchDesc d1 = tree_pass({11, 42, 7}, n_hist, n_hist + 3, 3, {1, 2, 4});
  std::vector<float> h1;
  for (int i = 0; i < 3; ++i) h1.insert(h1.end(), root.begin(), root.end());
  b.cpu->forward_hidden(d1, h1, &c1);
  b.gpu->forward_hidden(d1, h1, &g1);
  check_pass(g1, c1, k, b.Dv, b.d2t);
  // Depth 2: node 3 under node 0 (mask bits 0, 3), node 4 under node 2 (bits 2, 4).
  const BatchDesc d2 = tree_pass({99, 123}, n_hist + 1, n_hist + 5, 5, {1 | 8, 4 | 16});
  std::vector<float> h2(c1.hidden.begin(), c1.hidden.begin() + H);
  h2.insert(h2.end(), c1.hidden.begin() + 2 * H, c1.hidden.begin() + 3 * H);
  Eagle3Model::Out c2, g2;
  b.cpu->forward_hidden(d2, h2, &c2);
  b.gpu->forward_hidden(d2, h2, &g2);
  check_pass(g2, c2, k, b.Dv, b.d2t);
  double num = 0, den = 0;
  for (size_t i = 0; i < c2.hidden.size(); ++i) {
    num += (double(g2.hidden[i]) - c2.hidden[i]) * (double(g2.hidden[i]) - c2.hidden[i]);
    den += double(c2.hidden[i]) * c2.hidden[i];
  }
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), 3e-2) << "depth-2 outputs";
}

}  // namespace
}  // namespace kiln
