#include "spec/verify.h"

#include <algorithm>

#include "kiln/error.h"

namespace kiln::spec {

Verdict verify_greedy(int32_t target_greedy, int32_t draft) {
  return {draft == target_greedy, target_greedy};
}

Verdict verify_point_draft(const Categorical& p, int32_t draft, std::mt19937_64& rng) {
  if (uniform01(rng) < p.prob(draft)) return {true, draft};
  return {false, p.draw_excluding(draft, uniform01(rng))};
}

Verdict verify_sampled_draft(const Categorical& p, std::span<const double> q, int32_t draft,
                             std::mt19937_64& rng) {
  KILN_CHECK(draft >= 0 && size_t(draft) < q.size(), "verify_sampled_draft: draft ", draft,
             " outside the draft distribution's ", q.size(), " ids");
  const double px = p.prob(draft), qx = q[size_t(draft)];
  KILN_CHECK(qx > 0.0, "verify_sampled_draft: the draft token ", draft, " has probability 0 under q");
  if (uniform01(rng) * qx < px) return {true, draft};  // u < p / q without the division
  const Categorical r = sampled_residual(p, q);
  const double u = uniform01(rng);
  // p <= q everywhere but at rounding level: p and q agree, and the draft would have been kept.
  if (!(r.mass > 0.0)) return {true, draft};
  return {false, r.draw(u)};
}

Categorical sampled_residual(const Categorical& p, std::span<const double> q) {
  Categorical r;
  r.ids.reserve(p.size());
  r.weights.reserve(p.size());
  r.mass = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const int32_t id = p.id_at(i);
    const double w = std::max(0.0, p.weights[i] / p.mass - (size_t(id) < q.size() ? q[size_t(id)] : 0.0));
    r.ids.push_back(id);
    r.weights.push_back(w);
    r.mass += w;
  }
  return r;
}

int32_t target_token(const TargetPosition& t, std::mt19937_64& rng) {
  return t.dist ? t.dist->draw(uniform01(rng)) : t.greedy;
}

}  // namespace kiln::spec
