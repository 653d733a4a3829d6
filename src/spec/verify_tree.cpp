#include "spec/verify_tree.h"

#include <utility>

#include "kiln/error.h"

namespace kiln::spec {

ChildVerdict verify_greedy_children(int32_t target_greedy, std::span<const int32_t> children) {
  for (size_t i = 0; i < children.size(); ++i)
    if (children[i] == target_greedy) return {int32_t(i), target_greedy};
  return {-1, target_greedy};
}

// With one child: verify_point_draft's uniforms and tokens exactly (prob_without({}) is prob, draw_without of
// one id is draw_excluding), so a chain verifies as verify_chain does.
ChildVerdict verify_point_children(const Categorical& p, std::span<const int32_t> children,
                                   std::mt19937_64& rng) {
  std::vector<int32_t> removed;
  removed.reserve(children.size());
  for (size_t i = 0; i < children.size(); ++i) {
    if (uniform01(rng) < p.prob_without(children[i], removed)) return {int32_t(i), children[i]};
    removed.push_back(children[i]);
  }
  return {-1, p.draw_without(removed, uniform01(rng))};
}

ChildVerdict verify_sampled_children(const Categorical& p, std::span<const double> q,
                                     std::span<const int32_t> children, std::mt19937_64& rng) {
  const Categorical* r = &p;  // r_i; the first is p itself (no copy of a vocabulary-wide row)
  Categorical residual;
  for (size_t i = 0; i < children.size(); ++i) {
    const int32_t x = children[i];
    KILN_CHECK(x >= 0 && size_t(x) < q.size() && q[size_t(x)] > 0.0, "verify_sampled_children: child ", i,
               "'s token ", x, " cannot be drawn from the draft distribution (", q.size(), " ids)");
    if (uniform01(rng) * q[size_t(x)] < r->prob(x)) return {int32_t(i), x};  // u < r / q without the division
    Categorical next = sampled_residual(*r, q);
    // r_i <= q everywhere but at rounding level: r_i and q agree, and x would have been kept.
    if (!(next.mass > 0.0)) return {int32_t(i), x};
    residual = std::move(next);
    r = &residual;
  }
  return {-1, r->draw(uniform01(rng))};
}

TreeStep verify_tree_step(const DraftTree& tree, int32_t node, const TargetPosition& t,
                          std::mt19937_64& rng) {
  const std::vector<int32_t> nodes = tree.children(node);
  if (nodes.empty()) return {-1, target_token(t, rng)};
  std::vector<int32_t> tokens(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) tokens[i] = tree.tokens[size_t(nodes[i])];
  ChildVerdict v;
  if (!t.dist) {
    v = verify_greedy_children(t.greedy, tokens);
  } else if (const std::vector<double>* q = tree.children_dist(node)) {
    v = verify_sampled_children(*t.dist, *q, tokens, rng);
  } else {
    v = verify_point_children(*t.dist, tokens, rng);
  }
  return {v.child < 0 ? -1 : nodes[size_t(v.child)], v.token};
}

}  // namespace kiln::spec
