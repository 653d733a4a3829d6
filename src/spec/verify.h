// The verification rule of speculative decoding: which draft tokens a sequence keeps, and the target's own
// token after them. The target's side at each position is what its sampler would use there, computed by
// the caller after every logit processor (bias, min-token mask, penalties with the earlier drafts counted as
// generated), temperature and filter (top-k, top-p, min-p): runtime/token_draw.h's token_distribution.
//
// Greedy (temperature 0): draft j is kept while it equals the target's greedy token at position j; the
// emitted tokens are then exactly the target's greedy tokens (the drafts kept, then the target's token at
// the first mismatch, or after the last draft).
//
// Sampling: rejection sampling (Leviathan et al. 2023, Chen et al. 2023) leaves the target's distribution
// exactly unchanged. Against a draft distribution q, draft token x is kept with probability
// min(1, p(x) / q(x)); on rejection the token comes from norm(max(0, p - q)). A deterministic drafter
// (n-gram) is the point mass q = [x]: x is kept with probability p(x); on rejection the token comes from p
// with x removed and renormalised. After the last kept draft of a chain whose drafts were all kept, the
// token is a plain draw from p at the next position. Uniforms come from the request's own generator
// (std::uniform_real_distribution<double>(0, 1), as token_draw), so a seeded request reproduces.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "spec/categorical.h"

namespace kiln::spec {

struct Verdict {
  bool accepted = false;  // the draft token is kept (token == the draft)
  int32_t token = -1;     // the token emitted at this position
};

// The target's side at one verify position: its greedy token (greedy requests) or its distribution.
struct TargetPosition {
  int32_t greedy = -1;                // used when dist is null
  const Categorical* dist = nullptr;  // sampling requests
};

Verdict verify_greedy(int32_t target_greedy, int32_t draft);
// Point-mass draft x: kept with probability p(x), else a draw from p without x. One uniform, two on
// rejection.
Verdict verify_point_draft(const Categorical& p, int32_t draft, std::mt19937_64& rng);
// Draft drawn from q (dense over the vocabulary, sums to 1): kept with probability min(1, p(x) / q(x)), else
// a draw from norm(max(0, p - q)). One uniform, two on rejection.
Verdict verify_sampled_draft(const Categorical& p, std::span<const double> q, int32_t draft,
                             std::mt19937_64& rng);
// The rejection residual of a sampled draft: norm(max(0, p - q)) over p's candidates (q's other ids have
// p = 0 and so no residual), ids explicit, mass its weight sum (0 where p <= q everywhere, i.e. p = q up to
// rounding). q is dense over the draft's ids; ids past its end count as q = 0.
Categorical sampled_residual(const Categorical& p, std::span<const double> q);
// The target's own token where no draft is left to check: the greedy token, or one draw from p.
int32_t target_token(const TargetPosition& t, std::mt19937_64& rng);
// One uniform in [0, 1) from the request's generator: the draw every verification rule here consumes.
inline double uniform01(std::mt19937_64& rng) {
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

// A chain draft d[0..k) verified left to right. target(j) returns the target's side at position j (after the
// context and d[0..j), all of them kept), called for j = 0, 1, ... in order and only while drafts are kept,
// at most k + 1 times, so the caller may advance per-position state (a penalty history) as it goes. Returns
// the emitted tokens: the kept drafts, then the target's token (1 .. k + 1 tokens).
template <typename TargetFn>
std::vector<int32_t> verify_chain(std::span<const int32_t> draft, TargetFn&& target, std::mt19937_64& rng) {
  std::vector<int32_t> out;
  out.reserve(draft.size() + 1);
  for (size_t j = 0; j <= draft.size(); ++j) {
    const TargetPosition t = target(j);
    if (j == draft.size()) {
      out.push_back(target_token(t, rng));
      break;
    }
    const Verdict v = t.dist ? verify_point_draft(*t.dist, draft[j], rng) : verify_greedy(t.greedy, draft[j]);
    out.push_back(v.token);
    if (!v.accepted) break;
  }
  return out;
}

}  // namespace kiln::spec
