// DraftTree: one sequence's drafts as a tree (EAGLE's top-k > 1 drafting, SpecInfer's token trees), the
// structure spec/verify_tree.h verifies. The root is the sequence's last known token (no node); node i is a
// draft token whose parent is the root (-1) or an earlier node, so the nodes are in an order where a parent
// precedes its children (EAGLE's and SGLang's breadth-first order is one). A node's children are its
// alternatives for the next position, tried in node order.
//
// The tree given here is already pruned: SGLang's EAGLE expands the top-k of each of the top-k frontier nodes
// per draft step and then keeps the `--speculative-num-draft-tokens` - 1 best nodes by cumulative draft
// probability (a node's parent always scores at least as well, so the kept set is a tree); the engine fills a
// DraftTree with the kept nodes only.
//
// How a node's children were drafted decides the verification rule (spec/verify_tree.h), so it is stored per
// parent:
//   deterministic  the children are a function of the context (EAGLE's top-k picks, n-gram branches): no q.
//                  Siblings must be distinct tokens (the rule removes each rejected token).
//   sampled        the children were drawn i.i.d. (with replacement) from one draft distribution q at that
//                  parent: child_dist[parent + 1] indexes draft_dists. Siblings may repeat a token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::spec {

struct DraftTree {
  static constexpr int32_t kRoot = -1;

  std::vector<int32_t> tokens;   // [n] node i's draft token (>= 0)
  std::vector<int32_t> parents;  // [n] parents[i] in [-1, i): -1 = a child of the root
  // Dense draft distributions over the draft's token ids, each summing to 1 (validated within 1e-6).
  std::vector<std::vector<double>> draft_dists;
  // [n + 1] or empty (every node's children deterministic): child_dist[p + 1] is the index in draft_dists of
  // the q that node p's children (p = -1: the root's) were drawn from i.i.d., or -1 where they are
  // deterministic. A leaf may have one (EAGLE computes q at every node); it is never read.
  std::vector<int32_t> child_dist;

  size_t size() const { return tokens.size(); }
  // Appends node (parent, token) and returns its index. Checks only that the parent exists; validate() checks
  // the rest.
  int32_t add(int32_t parent, int32_t token);
  // Marks node `parent`'s children as drawn i.i.d. from q (a copy is stored); returns q's index.
  int32_t set_children_dist(int32_t parent, std::vector<double> q);
  // The q node `parent`'s children were drawn from, or null (deterministic children).
  const std::vector<double>* children_dist(int32_t parent) const;

  std::vector<int32_t> children(int32_t node) const;  // in node order; node = kRoot: the root's
  std::vector<int32_t> path(int32_t node) const;      // the root's child first, node last; empty for kRoot
  int depth(int32_t node) const;                      // kRoot 0, the root's children 1
  int max_depth() const;                              // 0 for an empty tree

  // Throws kiln::Error naming the node (or distribution) and what is wrong: sizes, a parent that is not an
  // earlier node, a negative token, repeated tokens among deterministic siblings, a bad child_dist entry, a
  // q that is not a distribution, a sampled child whose token q cannot draw (outside q or q = 0 there).
  void validate() const;
};

}  // namespace kiln::spec
