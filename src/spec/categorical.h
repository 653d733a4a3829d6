// Categorical: a distribution over token ids exactly as the sampler draws from it (runtime/token_draw.h
// builds it from a processed logit row) and as the verifier accepts or rejects draft tokens against it
// (spec/verify.h). One type for both, so the draw and the verification can never disagree on the
// distribution.
//
//   ids      candidates in draw order; empty: every id 0 .. weights.size() - 1, in id order
//   weights  [candidates] >= 0, the candidates' softmax probabilities (not renormalised after filtering)
//   mass     what a draw scales its uniform u by: the candidates' weight sum as the sampler computed it
//
// draw(u), u in [0, 1): the first candidate, in draw order, whose running weight sum exceeds u * mass; the
// last candidate when rounding leaves u * mass at or past the final sum. prob(id) = weight / mass (0 for an
// id that is no candidate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kiln::spec {

struct Categorical {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  double mass = 1.0;

  size_t size() const { return weights.size(); }
  int32_t id_at(size_t i) const { return ids.empty() ? int32_t(i) : ids[i]; }
  double prob(int32_t id) const;
  int32_t draw(double u) const;
  // The residual of a point-mass draft: this distribution with `excluded` removed and renormalised, drawn
  // at u. When no other candidate has weight, returns `excluded` (the distribution is that point).
  int32_t draw_excluding(int32_t excluded, double u) const;
  // The residual of several rejected point-mass drafts (spec/verify_tree.h): this distribution with every id
  // in `removed` dropped and renormalised over the rest's weight sum. With `removed` empty they are prob(id)
  // and draw(u) exactly; with one id, draw_without is draw_excluding(removed[0], u) exactly. Where the
  // removed ids held all the weight, prob_without is 0 and draw_without returns removed.back().
  double prob_without(int32_t id, std::span<const int32_t> removed) const;
  int32_t draw_without(std::span<const int32_t> removed, double u) const;
};

}  // namespace kiln::spec
