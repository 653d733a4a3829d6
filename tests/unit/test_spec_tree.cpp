// Tree verification (spec/verify_tree.h) on the sampler's own distributions: the tokens a tree emits follow
// the target's distribution exactly (Pearson chi-square over many seeded draws, thresholds at an upper tail
// of 1e-10 as in test_spec_verify.cpp: df 3: 49.54, 7: 60.90, 15: 79.15), for point-mass and i.i.d.-sampled
// siblings and a depth-2 tree; each check also runs a deliberately wrong verifier that must fail it. Greedy
// trees emit exactly the target's greedy walk; a chain verifies bit for bit as verify_chain does; the tree's
// helpers, its validation and Categorical's removal of several ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>

#include "common/chi_square.h"
#include "kiln/error.h"
#include "runtime/token_draw.h"
#include "spec/verify_tree.h"

namespace kiln::spec {
namespace {

using test_support::kChi2Df15;
using test_support::kChi2Df3;
using test_support::kChi2Df7;
using test_support::probs_of;
constexpr int kDraws = 400000;

double uniform(std::mt19937_64& rng) {
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

Categorical dist_of(const std::vector<float>& logits, float temperature, int top_k = -1) {
  SamplingParams sp;
  sp.temperature = temperature;
  sp.top_k = top_k;
  Categorical c;
  token_distribution(logits.data(), int64_t(logits.size()), sp, &c);
  return c;
}

// The statistic of the cell `one` returns, over kDraws draws from one seeded generator.
double chi_square_of(const std::vector<double>& want, uint64_t seed,
                     const std::function<int32_t(std::mt19937_64&)>& one) {
  return test_support::chi_square(test_support::emitted_counts(want.size(), kDraws, seed, one), want, kDraws);
}

// A depth-1 tree: the root's children, deterministic, or drawn from q where q is given.
DraftTree fan(std::span<const int32_t> children, const std::vector<double>* q = nullptr) {
  DraftTree t;
  for (int32_t x : children) t.add(DraftTree::kRoot, x);
  if (q) t.set_children_dist(DraftTree::kRoot, *q);
  return t;
}

const std::vector<float> kLogits{2.0f, 1.5f, 1.1f, 0.4f, 0.0f, -0.3f, -1.0f, -1.6f};

TEST(SpecTree, PointSiblingsKeepTheTargetDistribution) {
  struct Case {
    float temperature;
    int top_k;
    std::vector<int32_t> children;
    double threshold;
  };
  // Two and three children; under top-k 4 a first child outside the support (never kept; df 3).
  const Case cases[] = {
      {1.0f, -1, {2, 0}, kChi2Df7}, {0.8f, -1, {0, 1, 3}, kChi2Df7}, {1.2f, 4, {6, 1, 0}, kChi2Df3}};
  uint64_t seed = 2000;
  for (const Case& c : cases) {
    const Categorical p = dist_of(kLogits, c.temperature, c.top_k);
    const std::vector<double> want = probs_of(p, kLogits.size());
    const DraftTree tree = fan(c.children);
    auto at = [&](int32_t) { return TargetPosition{-1, &p}; };
    EXPECT_LT(chi_square_of(want, ++seed,
                            [&](std::mt19937_64& rng) { return verify_tree(tree, at, rng).tokens[0]; }),
              c.threshold)
        << c.children.size() << " children";
    // Wrong: the residual drops only the last rejected child, so an earlier one can come back.
    const double forgets = chi_square_of(want, seed, [&](std::mt19937_64& rng) {
      std::vector<int32_t> removed;
      for (int32_t x : c.children) {
        if (uniform(rng) < p.prob_without(x, removed)) return x;
        removed.push_back(x);
      }
      return p.draw_excluding(removed.back(), uniform(rng));
    });
    EXPECT_GT(forgets, c.threshold) << c.children.size() << " children";
    // Wrong: each child kept with p(x) instead of the renormalised p_i(x).
    const double unrenormalised = chi_square_of(want, seed, [&](std::mt19937_64& rng) {
      std::vector<int32_t> removed;
      for (int32_t x : c.children) {
        if (uniform(rng) < p.prob(x)) return x;
        removed.push_back(x);
      }
      return p.draw_without(removed, uniform(rng));
    });
    EXPECT_GT(unrenormalised, c.threshold) << c.children.size() << " children";
  }
}

TEST(SpecTree, SampledSiblingsKeepTheTargetDistribution) {
  const Categorical p = dist_of(kLogits, 0.9f);
  const std::vector<double> want = probs_of(p, kLogits.size());
  // A draft model that disagrees: nearly flat, with its own favourite.
  const std::vector<double> q{0.05, 0.1, 0.1, 0.3, 0.15, 0.1, 0.1, 0.1};
  std::discrete_distribution<int32_t> from_q(q.begin(), q.end());
  auto at = [&](int32_t) { return TargetPosition{-1, &p}; };
  for (int m : {2, 3}) {
    const uint64_t seed = 3000 + uint64_t(m);
    EXPECT_LT(chi_square_of(want, seed,
                            [&](std::mt19937_64& rng) {
                              std::vector<int32_t> xs(static_cast<size_t>(m));
                              for (int32_t& x : xs) x = from_q(rng);  // i.i.d.: repeats allowed
                              return verify_tree(fan(xs, &q), at, rng).tokens[0];
                            }),
              kChi2Df7)
        << m << " siblings";
    // Wrong: every sibling judged against p, not the residual left by the earlier ones.
    const double stale = chi_square_of(want, seed, [&](std::mt19937_64& rng) {
      std::vector<int32_t> xs(static_cast<size_t>(m));
      for (int32_t& x : xs) x = from_q(rng);
      for (int32_t x : xs)
        if (uniform(rng) * q[size_t(x)] < p.prob(x)) return x;
      return sampled_residual(p, q).draw(uniform(rng));
    });
    EXPECT_GT(stale, kChi2Df7) << m << " siblings";
    // Wrong: siblings drawn without replacement (distinct) but verified as i.i.d. draws.
    const double distinct = chi_square_of(want, seed, [&](std::mt19937_64& rng) {
      std::vector<int32_t> xs;
      std::vector<double> left = q;
      for (int i = 0; i < m; ++i) {
        std::discrete_distribution<int32_t> d(left.begin(), left.end());
        xs.push_back(d(rng));
        left[size_t(xs.back())] = 0.0;
      }
      return verify_tree(fan(xs, &q), at, rng).tokens[0];
    });
    EXPECT_GT(distinct, kChi2Df7) << m << " siblings";
  }
}

// A depth-2 tree over a vocabulary of 4, branching at both levels, where the second position's distribution
// depends on the first token: the pair of tokens emitted (the second drawn by the next step when the tree
// emits one) must follow p0(t0) p1(t1 | t0): 16 cells, df 15. Deterministic and i.i.d.-sampled siblings.
TEST(SpecTree, DepthTwoTreeKeepsTheJointDistribution) {
  const Categorical p0 = dist_of({1.0f, 0.2f, -0.5f, 0.6f}, 1.0f);
  std::vector<Categorical> p1;
  for (int t = 0; t < 4; ++t)
    p1.push_back(dist_of({0.3f * float(t), -0.4f, 0.8f - 0.5f * float(t), 0.1f * float(t * t)}, 1.0f));
  std::vector<double> want(16);
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b) want[size_t(a * 4 + b)] = p0.prob(a) * p1[size_t(a)].prob(b);
  const std::vector<double> q0{0.1, 0.3, 0.4, 0.2};
  std::vector<std::vector<double>> q1{
      {0.25, 0.25, 0.25, 0.25}, {0.6, 0.1, 0.1, 0.2}, {0.1, 0.2, 0.3, 0.4}, {0.4, 0.4, 0.1, 0.1}};

  // Deterministic: 3 -> {0, 2}, 0 -> {1, 3}. Sampled: two i.i.d. children of the root from q0, each with two
  // i.i.d. children from q1 of its token.
  auto point_tree = [](std::mt19937_64&) {
    DraftTree t;
    const int32_t a = t.add(DraftTree::kRoot, 3), b = t.add(DraftTree::kRoot, 0);
    t.add(a, 0), t.add(a, 2), t.add(b, 1), t.add(b, 3);
    return t;
  };
  std::discrete_distribution<int32_t> from_q0(q0.begin(), q0.end());
  std::vector<std::discrete_distribution<int32_t>> from_q1;
  for (const auto& q : q1) from_q1.emplace_back(q.begin(), q.end());
  auto sampled_tree = [&](std::mt19937_64& rng) {
    DraftTree t;
    t.set_children_dist(DraftTree::kRoot, q0);
    for (int i = 0; i < 2; ++i) {
      const int32_t x = from_q0(rng), c = t.add(DraftTree::kRoot, x);
      for (int j = 0; j < 2; ++j) t.add(c, from_q1[size_t(x)](rng));
      t.set_children_dist(c, q1[size_t(x)]);
    }
    return t;
  };
  // The right target after node: p1 of its token. The wrong one (a verify step that computed every
  // depth-1 node's row as if after the first sibling) p1 of the first root child's token.
  auto run = [&](const std::function<DraftTree(std::mt19937_64&)>& make, bool right, uint64_t seed) {
    return chi_square_of(want, seed, [&](std::mt19937_64& rng) {
      const DraftTree tree = make(rng);
      const TreeVerdict v = verify_tree(
          tree,
          [&](int32_t node) {
            if (node == DraftTree::kRoot) return TargetPosition{-1, &p0};
            if (tree.depth(node) == 2) return TargetPosition{-1, &p0};  // the third token is not counted
            const int32_t from = right ? node : tree.children(DraftTree::kRoot)[0];
            return TargetPosition{-1, &p1[size_t(tree.tokens[size_t(from)])]};
          },
          rng);
      const int32_t t0 = v.tokens[0];
      const int32_t t1 = v.tokens.size() > 1 ? v.tokens[1] : p1[size_t(t0)].draw(uniform(rng));
      return t0 * 4 + t1;
    });
  };
  EXPECT_LT(run(point_tree, true, 4001), kChi2Df15);
  EXPECT_GT(run(point_tree, false, 4001), kChi2Df15);
  EXPECT_LT(run(sampled_tree, true, 4002), kChi2Df15);
  EXPECT_GT(run(sampled_tree, false, 4002), kChi2Df15);
}

// The target's greedy token after a path: a fixed function of the path's tokens over a vocabulary of 4.
int32_t greedy_after(const std::vector<int32_t>& tokens) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : tokens) h = (h ^ uint64_t(t)) * 1099511628211ull;
  return int32_t((h >> 29) % 4);
}

TEST(SpecTree, GreedyEmitsTheTargetsGreedyWalk) {
  std::mt19937_64 gen(5);
  for (int trial = 0; trial < 2000; ++trial) {
    // A random tree of up to 24 nodes over 4 tokens, distinct siblings.
    DraftTree tree;
    const int n = int(gen() % 25);
    for (int i = 0; i < n; ++i) {
      const int32_t parent = int32_t(gen() % uint64_t(tree.size() + 1)) - 1;
      std::vector<int32_t> taken;
      for (int32_t c : tree.children(parent)) taken.push_back(tree.tokens[size_t(c)]);
      const int32_t x = int32_t(gen() % 4);
      if (std::find(taken.begin(), taken.end(), x) == taken.end()) tree.add(parent, x);
    }
    std::vector<int32_t> calls;
    std::mt19937_64 rng(trial), untouched(trial);
    const TreeVerdict v = verify_tree(
        tree,
        [&](int32_t node) {
          calls.push_back(node);
          std::vector<int32_t> prefix;
          for (int32_t a : tree.path(node)) prefix.push_back(tree.tokens[size_t(a)]);
          return TargetPosition{greedy_after(prefix), nullptr};
        },
        rng);
    // The expected walk: follow the child holding the greedy token while there is one.
    std::vector<int32_t> want_tokens, want_path, prefix;
    for (int32_t node = DraftTree::kRoot;;) {
      const int32_t g = greedy_after(prefix);
      want_tokens.push_back(g);
      int32_t next = -1;
      for (int32_t c : tree.children(node))
        if (tree.tokens[size_t(c)] == g) next = c;
      if (next < 0) break;
      want_path.push_back(node = next);
      prefix.push_back(g);
    }
    ASSERT_EQ(v.tokens, want_tokens) << trial;
    ASSERT_EQ(v.path, want_path) << trial;
    std::vector<int32_t> want_calls{DraftTree::kRoot};
    want_calls.insert(want_calls.end(), want_path.begin(), want_path.end());
    ASSERT_EQ(calls, want_calls) << trial;  // the root and the kept nodes only, in path order
    ASSERT_LE(calls.size(), size_t(tree.max_depth() + 1));
    ASSERT_EQ(rng(), untouched()) << trial;  // greedy draws no uniforms
  }
  // The branch that matches deeper is taken, not the first child: 5 -> 6 is first, 7 -> 8 -> 9 matches.
  DraftTree t;
  const int32_t a = t.add(DraftTree::kRoot, 5), b = t.add(DraftTree::kRoot, 7);
  t.add(a, 6);
  const int32_t c = t.add(b, 8);
  const int32_t d = t.add(c, 9);
  const std::vector<int32_t> walk{7, 8, 9, 4};  // the target's greedy tokens after root, 7, 7 8, 7 8 9
  std::mt19937_64 rng(1);
  const TreeVerdict v = verify_tree(
      t,
      [&](int32_t node) {
        return TargetPosition{walk[size_t(t.depth(node))], nullptr};
      },
      rng);
  EXPECT_EQ(v.path, (std::vector<int32_t>{b, c, d}));
  EXPECT_EQ(v.tokens, walk);
}

// A chain is a tree with one child a node: verify_tree gives verify_chain's tokens and leaves the generator
// where verify_chain leaves it, greedy and point-mass, on random distributions (filtered or not).
TEST(SpecTree, ChainVerifiesAsVerifyChain) {
  std::mt19937_64 gen(11);
  int kept_some = 0, rejected_some = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int V = 2 + int(gen() % 40);
    const size_t k = gen() % 7;
    const bool greedy = trial % 3 == 0;
    std::vector<Categorical> pos(k + 1);
    std::vector<int32_t> greedy_tok(k + 1);
    for (size_t j = 0; j <= k; ++j) {
      std::vector<float> logits(static_cast<size_t>(V));
      for (float& x : logits) x = float(int(gen() % 2000) - 1000) / 300.0f;
      pos[j] = dist_of(logits, 0.3f + float(gen() % 15) / 10.0f, trial % 4 == 1 ? 1 + int(gen() % 5) : -1);
      greedy_tok[j] = int32_t(gen() % uint64_t(V));
    }
    // Drafts that are often right: the target's greedy token or a draw from p, else any id.
    std::vector<int32_t> draft(k);
    for (size_t j = 0; j < k; ++j) {
      const uint64_t r = gen() % 3;
      draft[j] = r == 0 ? int32_t(gen() % uint64_t(V)) : greedy ? greedy_tok[j] : pos[j].draw(uniform(gen));
    }
    DraftTree chain;
    for (size_t j = 0; j < k; ++j) chain.add(int32_t(j) - 1, draft[j]);
    auto side = [&](size_t j) {
      return greedy ? TargetPosition{greedy_tok[j], nullptr} : TargetPosition{-1, &pos[j]};
    };
    std::mt19937_64 a(uint64_t(trial) * 7 + 1), b(uint64_t(trial) * 7 + 1);
    const std::vector<int32_t> want = verify_chain(draft, side, a);
    const TreeVerdict v = verify_tree(
        chain, [&](int32_t node) { return side(size_t(node + 1)); }, b);
    ASSERT_EQ(v.tokens, want) << trial;
    ASSERT_EQ(v.path.size() + 1, want.size()) << trial;
    for (size_t j = 0; j < v.path.size(); ++j) ASSERT_EQ(v.path[j], int32_t(j));
    ASSERT_EQ(a(), b()) << trial;
    kept_some += !v.path.empty();
    rejected_some += v.path.size() < k;
  }
  EXPECT_GT(kept_some, 500);
  EXPECT_GT(rejected_some, 500);
}

// One i.i.d.-sampled child is one verify_sampled_draft: the same verdict and generator state.
TEST(SpecTree, OneSampledChildIsVerifySampledDraft) {
  std::mt19937_64 gen(13);
  for (int trial = 0; trial < 2000; ++trial) {
    const int V = 2 + int(gen() % 30);
    std::vector<float> logits(static_cast<size_t>(V));
    for (float& x : logits) x = float(int(gen() % 2000) - 1000) / 300.0f;
    const Categorical p = dist_of(logits, 1.0f, trial % 3 == 0 ? 1 + int(gen() % 5) : -1);
    std::vector<double> q(static_cast<size_t>(V));
    double s = 0.0;
    for (double& x : q) s += (x = 0.05 + double(gen() % 100));
    for (double& x : q) x /= s;
    const int32_t x = int32_t(gen() % uint64_t(V));
    std::mt19937_64 a{uint64_t(trial)}, b{uint64_t(trial)};
    const Verdict want = verify_sampled_draft(p, q, x, a);
    const ChildVerdict got = verify_sampled_children(p, q, std::vector<int32_t>{x}, b);
    ASSERT_EQ(got.child == 0, want.accepted) << trial;
    ASSERT_EQ(got.token, want.token) << trial;
    ASSERT_EQ(a(), b()) << trial;
  }
}

TEST(SpecTree, CategoricalWithoutRemovesAndRenormalises) {
  std::mt19937_64 gen(17);
  for (int trial = 0; trial < 500; ++trial) {
    const int V = 1 + int(gen() % 20);
    std::vector<float> logits(static_cast<size_t>(V));
    for (float& x : logits) x = float(int(gen() % 2000) - 1000) / 300.0f;
    const Categorical p = dist_of(logits, 1.0f, trial % 2 ? 1 + int(gen() % 6) : -1);  // ids explicit or not
    std::vector<int32_t> removed(gen() % 4);
    for (int32_t& r : removed) r = int32_t(gen() % uint64_t(V + 2));  // ids past the vocabulary too
    // The reference: the candidates not removed, renormalised over their weight sum.
    Categorical kept;
    kept.mass = 0.0;
    for (size_t i = 0; i < p.size(); ++i)
      if (std::find(removed.begin(), removed.end(), p.id_at(i)) == removed.end()) {
        kept.ids.push_back(p.id_at(i));
        kept.weights.push_back(p.weights[i]);
        kept.mass += p.weights[i];
      }
    const Categorical& ref = removed.empty() ? p : kept;
    for (int32_t id = -1; id < V + 2; ++id) {
      const double got = p.prob_without(id, removed);
      if (ref.mass > 0.0) {
        ASSERT_EQ(got, ref.prob(id)) << trial << " id " << id;
      } else {
        ASSERT_EQ(got, 0.0);
      }
    }
    for (int i = 0; i < 50; ++i) {
      const double u = uniform(gen);
      const int32_t got = p.draw_without(removed, u);
      ASSERT_EQ(got, ref.mass > 0.0 ? ref.draw(u) : removed.back()) << trial;
      if (removed.size() == 1) {
        ASSERT_EQ(got, p.draw_excluding(removed[0], u));
      }
      if (removed.empty()) {
        ASSERT_EQ(got, p.draw(u));
      }
    }
  }
  // Everything removed: the last removed id, probability 0.
  Categorical two;
  two.weights = {0.5, 0.5};
  const std::vector<int32_t> all{1, 0};
  EXPECT_EQ(two.draw_without(all, 0.3), 0);
  EXPECT_EQ(two.prob_without(1, std::vector<int32_t>{0}), 1.0);
  EXPECT_EQ(two.prob_without(1, all), 0.0);
}

TEST(SpecTree, PathChildrenAndDepth) {
  DraftTree t;  // root -> {0: 10, 1: 11}; 0 -> {2: 12, 4: 14}; 2 -> {3: 13}
  EXPECT_EQ(t.max_depth(), 0);
  EXPECT_EQ(t.add(-1, 10), 0);
  t.add(-1, 11), t.add(0, 12), t.add(2, 13), t.add(0, 14);
  t.validate();
  EXPECT_EQ(t.children(DraftTree::kRoot), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(t.children(0), (std::vector<int32_t>{2, 4}));
  EXPECT_TRUE(t.children(3).empty());
  EXPECT_EQ(t.path(3), (std::vector<int32_t>{0, 2, 3}));
  EXPECT_TRUE(t.path(DraftTree::kRoot).empty());
  EXPECT_EQ(t.depth(DraftTree::kRoot), 0);
  EXPECT_EQ(t.depth(4), 2);
  EXPECT_EQ(t.max_depth(), 3);
  EXPECT_EQ(t.children_dist(0), nullptr);
  std::vector<double> q(15, 0.0);
  q[12] = q[14] = 0.5;
  EXPECT_EQ(t.set_children_dist(0, q), 0);
  ASSERT_NE(t.children_dist(0), nullptr);
  EXPECT_EQ(*t.children_dist(0), q);
  t.validate();
  EXPECT_EQ(t.children_dist(1), nullptr);
  EXPECT_EQ(t.add(4, 15), 5);  // child_dist grows with the nodes
  EXPECT_EQ(t.child_dist.size(), 7u);
}

void expect_invalid(const DraftTree& t, const std::string& says) {
  try {
    t.validate();
    ADD_FAILURE() << "no error; want one saying " << says;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(SpecTree, ValidationNamesWhatIsWrong) {
  DraftTree ok;
  ok.add(-1, 3), ok.add(-1, 4), ok.add(0, 3);
  ok.validate();
  {
    DraftTree t = ok;
    t.parents.pop_back();
    expect_invalid(t, "3 tokens but 2 parents");
  }
  {
    DraftTree t = ok;
    t.parents[1] = 1;  // itself
    expect_invalid(t, "node 1's parent 1 is not the root (-1) or an earlier node");
    t.parents[1] = 2;  // a later node
    expect_invalid(t, "node 1's parent 2");
    t.parents[1] = -2;
    expect_invalid(t, "node 1's parent -2");
  }
  {
    DraftTree t = ok;
    t.tokens[2] = -1;
    expect_invalid(t, "node 2 has token -1");
  }
  {
    DraftTree t = ok;
    t.add(-1, 4);  // node 3 repeats node 1's token under the root
    expect_invalid(t, "nodes 1 and 3 are deterministic siblings with the same token 4");
  }
  {
    DraftTree t = ok;  // repeats are fine among i.i.d. sampled siblings
    t.add(-1, 4);
    t.set_children_dist(-1, {0.0, 0.0, 0.0, 0.5, 0.5});
    t.validate();
    t.draft_dists[0][3] = 0.0, t.draft_dists[0][4] = 1.0;
    expect_invalid(t, "node 0's token 3 cannot be drawn from its parent's draft distribution");
    t.draft_dists[0] = {0.0, 0.0, 0.0, 1.0};
    expect_invalid(t, "node 1's token 4 cannot be drawn");
    t.draft_dists[0] = {0.0, 0.0, 0.0, 0.5, 0.6};
    expect_invalid(t, "draft distribution 0 sums to 1.1");
    t.draft_dists[0] = {0.0, 0.0, -0.5, 0.5, 1.0};
    expect_invalid(t, "draft distribution 0 has q[2] = -0.5");
    t.draft_dists[0] = {0.0, 0.0, 0.0, NAN, 0.5};
    expect_invalid(t, "has q[3] = nan");
    t.draft_dists[0].clear();
    expect_invalid(t, "draft distribution 0 is empty");
  }
  {
    DraftTree t = ok;
    t.child_dist = {-1, 0};
    expect_invalid(t, "child_dist has 2 entries, want 0 or nodes + 1 = 4");
    t.child_dist = {-1, 2, -1, -1};
    expect_invalid(t, "node 0's child_dist 2 is not -1 or one of 0 draft distributions");
  }
  EXPECT_THROW(ok.add(3, 1), Error);  // no node 3 yet
  EXPECT_THROW(DraftTree().set_children_dist(0, {1.0}), Error);
  // verify_tree validates first.
  DraftTree bad = ok;
  bad.parents[0] = 2;
  std::mt19937_64 rng(1);
  EXPECT_THROW(verify_tree(
                   bad,
                   [](int32_t) {
                     return TargetPosition{3, nullptr};
                   },
                   rng),
               Error);
}

}  // namespace
}  // namespace kiln::spec
