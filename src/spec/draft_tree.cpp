#include "spec/draft_tree.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kiln/error.h"

namespace kiln::spec {

int32_t DraftTree::add(int32_t parent, int32_t token) {
  KILN_CHECK(parent >= kRoot && size_t(parent + 1) <= size(), "DraftTree::add: parent ", parent,
             " is not a node of a tree of ", size(), " nodes");
  tokens.push_back(token);
  parents.push_back(parent);
  if (!child_dist.empty()) child_dist.push_back(-1);
  return int32_t(size() - 1);
}

int32_t DraftTree::set_children_dist(int32_t parent, std::vector<double> q) {
  KILN_CHECK(parent >= kRoot && size_t(parent + 1) <= size(), "DraftTree::set_children_dist: parent ", parent,
             " is not a node of a tree of ", size(), " nodes");
  if (child_dist.empty()) child_dist.assign(size() + 1, -1);
  draft_dists.push_back(std::move(q));
  child_dist[size_t(parent + 1)] = int32_t(draft_dists.size() - 1);
  return child_dist[size_t(parent + 1)];
}

const std::vector<double>* DraftTree::children_dist(int32_t parent) const {
  if (child_dist.empty()) return nullptr;
  const int32_t d = child_dist[size_t(parent + 1)];
  return d < 0 ? nullptr : &draft_dists[size_t(d)];
}

std::vector<int32_t> DraftTree::children(int32_t node) const {
  std::vector<int32_t> out;
  // Children come after their parent: start the scan there.
  for (size_t i = size_t(node + 1); i < size(); ++i)
    if (parents[i] == node) out.push_back(int32_t(i));
  return out;
}

std::vector<int32_t> DraftTree::path(int32_t node) const {
  std::vector<int32_t> out;
  for (int32_t v = node; v != kRoot; v = parents[size_t(v)]) out.push_back(v);
  return {out.rbegin(), out.rend()};
}

int DraftTree::depth(int32_t node) const {
  int d = 0;
  for (int32_t v = node; v != kRoot; v = parents[size_t(v)]) ++d;
  return d;
}

int DraftTree::max_depth() const {
  // parents precede children, so one forward pass has every parent's depth ready.
  std::vector<int> d(size());
  int best = 0;
  for (size_t i = 0; i < size(); ++i) {
    d[i] = parents[i] == kRoot ? 1 : d[size_t(parents[i])] + 1;
    best = std::max(best, d[i]);
  }
  return best;
}

void DraftTree::validate() const {
  const size_t n = size();
  KILN_CHECK(parents.size() == n, "DraftTree: ", n, " tokens but ", parents.size(), " parents");
  KILN_CHECK(child_dist.empty() || child_dist.size() == n + 1, "DraftTree: child_dist has ",
             child_dist.size(), " entries, want 0 or nodes + 1 = ", n + 1);
  for (size_t i = 0; i < n; ++i) {
    KILN_CHECK(parents[i] >= kRoot && parents[i] < int32_t(i), "DraftTree: node ", i, "'s parent ",
               parents[i], " is not the root (-1) or an earlier node (parents must precede their children)");
    KILN_CHECK(tokens[i] >= 0, "DraftTree: node ", i, " has token ", tokens[i]);
  }
  for (size_t qi = 0; qi < draft_dists.size(); ++qi) {
    const std::vector<double>& q = draft_dists[qi];
    KILN_CHECK(!q.empty(), "DraftTree: draft distribution ", qi, " is empty");
    double sum = 0.0;
    for (size_t v = 0; v < q.size(); ++v) {
      KILN_CHECK(std::isfinite(q[v]) && q[v] >= 0.0, "DraftTree: draft distribution ", qi, " has q[", v,
                 "] = ", q[v]);
      sum += q[v];
    }
    KILN_CHECK(std::abs(sum - 1.0) <= 1e-6, "DraftTree: draft distribution ", qi, " sums to ", sum,
               ", not 1");
  }
  for (size_t p = 0; p < child_dist.size(); ++p)
    KILN_CHECK(child_dist[p] >= -1 && child_dist[p] < int32_t(draft_dists.size()), "DraftTree: node ",
               int32_t(p) - 1, "'s child_dist ", child_dist[p], " is not -1 or one of ", draft_dists.size(),
               " draft distributions");
  for (size_t i = 0; i < n; ++i) {
    const std::vector<double>* q = children_dist(parents[i]);
    if (q) {
      const int32_t t = tokens[i];
      KILN_CHECK(size_t(t) < q->size() && (*q)[size_t(t)] > 0.0, "DraftTree: node ", i, "'s token ", t,
                 " cannot be drawn from its parent's draft distribution (", q->size(),
                 " ids, q = ", size_t(t) < q->size() ? (*q)[size_t(t)] : 0.0, ")");
      continue;
    }
    // A repeated deterministic sibling could never be kept: its token was removed when the first one was
    // rejected. It is a drafter's bug, so refuse it.
    for (size_t j = size_t(parents[i] + 1); j < i; ++j)
      KILN_CHECK(!(parents[j] == parents[i] && tokens[j] == tokens[i]), "DraftTree: nodes ", j, " and ", i,
                 " are deterministic siblings with the same token ", tokens[i]);
  }
}

}  // namespace kiln::spec
