// The verification rule for tree drafts (spec/draft_tree.h): which path of the tree a sequence keeps, and the
// target's own token after it. The walk starts at the root (the sequence's last known token); at each node it
// reaches, the target's side at the position after that node (spec/verify.h's TargetPosition, the same
// distribution the sampler would draw from there) decides among the node's children in their order, keeps at
// most one and moves to it, or emits its own token and stops. A chain (one child a node) gives exactly
// verify_chain's tokens for the same generator state.
//
// The rule at one node, by how its children were drafted:
//
// Greedy (the request's temperature is 0, t.dist null): the child whose token is the target's greedy token is
// kept (the first such child; deterministic siblings are distinct, so at most one); none: the greedy token.
// The emitted tokens are exactly the target's greedy walk. No uniforms.
//
// Deterministic children x_1 .. x_m (no q: top-k picks, n-gram branches; point-mass drafts), p the target's
// distribution: p_1 = p; child i is kept with probability p_i(x_i); on rejection p_{i+1} = p_i with x_i
// removed and renormalised; all rejected: a draw from p_{m+1} (p without x_1 .. x_m). Why the emitted token
// follows p exactly: the drafts are a function of the context, so conditioning on them changes nothing, and
// by backward induction the token emitted from step i on follows p_i. After the last step it is a draw from
// p_{m+1}; at step i, P(y) = p_i(x_i) [y = x_i] + (1 - p_i(x_i)) p_{i+1}(y), and p_{i+1}(y) =
// p_i(y) / (1 - p_i(x_i)) for y != x_i, 0 at y = x_i, so P(y) = p_i(y) for every y (p_i(x_i) = 1 leaves no
// rejection to account for). Hence step 1 emits from p_1 = p. It is sequential rejection sampling with point
// masses: each rejection tells only "not x_i", which is what removing x_i conditions on. One uniform per
// child tried, one more where all are rejected.
//
// Sampled children x_1 .. x_m drawn i.i.d. from q at that parent (SpecInfer's multi-step speculative
// sampling): r_1 = p; child i is kept with probability min(1, r_i(x_i) / q(x_i)); on rejection r_{i+1} =
// norm(max(0, r_i - q)); all rejected: a draw from r_{m+1}. Each step is one ordinary speculative-sampling
// step for the target r_i against the proposal q: it keeps y with probability q(y) min(1, r_i(y) / q(y)) =
// min(q, r_i)(y) and rejects with probability beta = sum(max(0, r_i - q)), so with the rest emitting from
// r_{i+1} (induction) it emits min(q, r_i)(y) + max(0, r_i - q)(y) = r_i(y). This needs x_{i+1} to follow q
// given the earlier rejections, which holds for independent draws (with replacement, so siblings may repeat).
// Siblings drawn without replacement would follow q with x_1 .. x_i removed and renormalised, and step i + 1
// would have to use that as its q (recursive rejection sampling): not what this rule does, so such a tree
// must not be marked sampled. Where r_i - q has no mass (r_i = q up to rounding) the rejected child is kept,
// as verify_sampled_draft does. One uniform per child tried, one more where all are rejected.
//
// EAGLE's and SGLang's trees are top-k picks, deterministic given the context: the point-mass rule. EAGLE's
// evaluate_posterior takes q(x) = 1, sets p(x) = 0 for each rejected sibling and renormalises, which is this
// rule; SGLang's tree_speculative_sampling_target_only (thresholds 1) compares one uniform per level with the
// running sum of the siblings' target probabilities and draws the last token from p with the rejected
// siblings zeroed: the same probabilities (sibling i kept with p(x_i) / (1 - sum_{j<i} p(x_j)) after the
// earlier rejections), another use of the uniforms. Uniforms come from the request's generator as in
// verify.h.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "spec/categorical.h"
#include "spec/draft_tree.h"
#include "spec/verify.h"

namespace kiln::spec {

// One node's decision among children whose tokens are given in order.
struct ChildVerdict {
  int32_t child = -1;  // the kept child's index in the tokens given, or -1: none kept
  int32_t token = -1;  // the token emitted at this position: the kept child's, else the target's
};

ChildVerdict verify_greedy_children(int32_t target_greedy, std::span<const int32_t> children);
// Deterministic (point-mass) children; distinct tokens.
ChildVerdict verify_point_children(const Categorical& p, std::span<const int32_t> children,
                                   std::mt19937_64& rng);
// Children drawn i.i.d. from q (dense over the draft's ids, sums to 1, q > 0 at every child's token).
ChildVerdict verify_sampled_children(const Categorical& p, std::span<const double> q,
                                     std::span<const int32_t> children, std::mt19937_64& rng);

// One step of the walk: node's children (none for a leaf: the target's token) judged by the rule their
// drafting and t call for.
struct TreeStep {
  int32_t kept = -1;   // the kept child's node index, or -1: the walk ends
  int32_t token = -1;  // the emitted token
};
TreeStep verify_tree_step(const DraftTree& tree, int32_t node, const TargetPosition& t, std::mt19937_64& rng);

struct TreeVerdict {
  std::vector<int32_t> path;    // the kept nodes, the root's child first: the nodes whose KV the engine keeps
  std::vector<int32_t> tokens;  // their tokens, then the target's token: path.size() + 1 tokens
};

// Validates the tree, then walks it. target(node) returns the target's side at the position after node
// (node = DraftTree::kRoot: after the sequence's last token) given the path to it; it is called only for the
// root and the kept nodes, in path order, at most max_depth() + 1 times, so the caller may advance
// per-position state (a penalty history) as it goes.
template <typename TargetFn>
TreeVerdict verify_tree(const DraftTree& tree, TargetFn&& target, std::mt19937_64& rng) {
  tree.validate();
  TreeVerdict out;
  for (int32_t node = DraftTree::kRoot;;) {
    const TargetPosition t = target(node);
    const TreeStep s = verify_tree_step(tree, node, t, rng);
    out.tokens.push_back(s.token);
    if (s.kept < 0) return out;
    node = s.kept;
    out.path.push_back(node);
  }
}

}  // namespace kiln::spec
