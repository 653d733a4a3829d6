// The sparse MLP's CPU oracle (ops/moe.h): routing edge cases with hand-computed weights, the canonical
// softmax sum, and moe_mlp against a per-token re-derivation of the contract.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/moe_contract.h"
#include "common/test_support.h"
#include "kiln/dtype.h"
#include "ops/cpu/moe.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/rms_norm.h"

using namespace kiln;

namespace {

std::vector<bf16_t> bf16s(const std::vector<float>& v) {
  std::vector<bf16_t> out;
  for (float f : v) out.push_back(f32_to_bf16(f));
  return out;
}

struct Routed {
  std::vector<int32_t> experts;
  std::vector<float> weights;  // the bf16 weights, widened
};

Routed route(const std::vector<float>& logits, int64_t T, int64_t k, bool norm) {
  std::vector<bf16_t> l = bf16s(logits);
  const int64_t E = int64_t(l.size()) / T;
  std::vector<int32_t> ex(size_t(T * k), -1);
  std::vector<bf16_t> w(size_t(T * k));
  ops::moe_route(Tensor(l.data(), DType::bf16, {T, E}), k, norm, Tensor(ex.data(), DType::i32, {T, k}),
                 Tensor(w.data(), DType::bf16, {T, k}));
  Routed r{ex, {}};
  for (bf16_t b : w) r.weights.push_back(bf16_to_f32(b));
  return r;
}

float bf(double v) {
  return bf16_to_f32(f32_to_bf16(float(v)));
}

}  // namespace

TEST(MoeRoute, TiesGoToTheLowerExpertIndex) {
  EXPECT_EQ(route({1, 3, 3, 2, 3}, 1, 2, false).experts, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(route({1, 3, 3, 2, 3}, 1, 3, false).experts, (std::vector<int32_t>{1, 2, 4}));
  EXPECT_EQ(route({3, 3, 3, 2, 3}, 1, 1, false).experts, (std::vector<int32_t>{0}));
  // All six equal: the first three, each 1/6 (or 1/3 renormalized).
  const Routed a = route({0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, 1, 3, false);
  EXPECT_EQ(a.experts, (std::vector<int32_t>{0, 1, 2}));
  for (float w : a.weights) EXPECT_EQ(w, bf(1.0 / 6));
  const Routed b = route({0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, 1, 3, true);
  for (float w : b.weights) EXPECT_EQ(w, bf(1.0 / 3));
}

// logits 0, 1, 2, 3; top-2 = experts 2 and 3, listed in ascending index.
//   softmax: p3 = 1 / (1 + e^-1 + e^-2 + e^-3) = 0.643914..., p2 = e^-1 p3 = 0.236882...
//   renormalized: 1 / (1 + e^-1) = 0.731058... and e^-1 / (1 + e^-1) = 0.268941...
// bf16 (8 significant bits): 0.64453125, 0.2373046875; 0.73046875, 0.26953125 (none near a rounding tie).
TEST(MoeRoute, HandComputedWeightsWithAndWithoutRenormalization) {
  const Routed plain = route({0, 1, 2, 3}, 1, 2, false);
  EXPECT_EQ(plain.experts, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(plain.weights, (std::vector<float>{0.2373046875f, 0.64453125f}));
  const Routed norm = route({0, 1, 2, 3}, 1, 2, true);
  EXPECT_EQ(norm.experts, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(norm.weights, (std::vector<float>{0.26953125f, 0.73046875f}));
  // top-k = E with renormalization: the softmax itself (sums to 1 already).
  const Routed all = route({0, 1, 2, 3}, 1, 4, true);
  EXPECT_EQ(all.experts, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(all.weights[3], 0.64453125f);
}

TEST(MoeRoute, ExpertChosenByNoTokenAndByEveryToken) {
  // 6 tokens, 4 experts, top-2: expert 3 leads every row, expert 0 trails every row.
  std::vector<float> logits;
  for (int t = 0; t < 6; ++t) {
    const float second = t % 2 ? 1.0f : 2.0f, third = t % 2 ? 2.0f : 1.0f;
    for (float v : {-4.0f, second, third, 4.0f}) logits.push_back(v);
  }
  const Routed r = route(logits, 6, 2, false);
  int count[4] = {};
  for (int32_t e : r.experts) ++count[e];
  EXPECT_EQ(count[0], 0);
  EXPECT_EQ(count[3], 6);
  EXPECT_EQ(count[1] + count[2], 6);
  for (int t = 0; t < 6; ++t) {
    EXPECT_EQ(r.experts[size_t(2 * t + 1)], 3);
    EXPECT_EQ(r.experts[size_t(2 * t)], t % 2 ? 2 : 1);
  }
}

// Lane sums then the butterfly differ from a sequential sum here: 1 + 63 x 2^-24 sequentially stays 1 (every
// add is a tie to even), while lanes 1..31 each hold 2 x 2^-24 exactly, which then survives.
TEST(MoeRoute, SoftmaxDenominatorUsesTheCanonicalLaneOrder) {
  std::vector<float> v(64, std::ldexp(1.0f, -24));
  v[0] = 1.0f;
  EXPECT_EQ(ops::cpu::moe_lane_sum(v.data(), 64), 1.0f + 31 * std::ldexp(1.0f, -23));
  float seq = 0;
  for (float x : v) seq += x;
  EXPECT_EQ(seq, 1.0f);
}

// The router logits' canonical order (ops/moe.h): an fmaf chain over a lane's 8-element chunks, then the
// xor butterfly. Row 0: one chunk holds 2^24, 1, -2^24: the chain loses the 1 (2^24 + 1 is a tie to even),
// linear's 8 partials (k mod 8) keep it. Row 1: 2^24 in lane 0, 1 in lane 1, -2^24 in lane 16: the
// butterfly cancels lanes 0 and 16 first and keeps the 1, a sequential sum of the chunks loses it.
TEST(MoeRouter, LogitsFollowTheCanonicalLaneOrder) {
  const int64_t H = 256, E = 2;
  const float big = std::ldexp(1.0f, 24);
  std::vector<float> w(size_t(E * H), 0.0f);
  w[0] = big, w[1] = 1.0f, w[2] = -big;
  w[size_t(H + 0)] = big, w[size_t(H + 8)] = 1.0f, w[size_t(H + 128)] = -big;
  std::vector<bf16_t> x = bf16s(std::vector<float>(size_t(H), 1.0f)), router = bf16s(w), logits(2), lin(2);
  const Tensor xt(x.data(), DType::bf16, {1, H}), rt(router.data(), DType::bf16, {E, H});
  ops::cpu::moe_router_logits(xt, rt, Tensor(logits.data(), DType::bf16, {1, E}));
  EXPECT_EQ(bf16_to_f32(logits[0]), 0.0f);
  EXPECT_EQ(bf16_to_f32(logits[1]), 1.0f);
  ops::linear(xt, rt, Tensor(lin.data(), DType::bf16, {1, E}));
  EXPECT_EQ(bf16_to_f32(lin[0]), 1.0f) << "linear's order differs here, so the case pins the router's";
}

TEST(MoeRoute, BadArgumentsNameTheProblem) {
  std::vector<bf16_t> l(8);
  std::vector<int32_t> ex(8);
  std::vector<bf16_t> w(8);
  const Tensor logits(l.data(), DType::bf16, {2, 4});
  test_support::expect_contains(test_support::error_of([&] {
                                  ops::moe_route(logits, 5, false, Tensor(ex.data(), DType::i32, {2, 5}),
                                                 Tensor(w.data(), DType::bf16, {2, 5}));
                                }),
                                {"moe_route", "top_k 5", "[1, 4]"});
  test_support::expect_contains(test_support::error_of([&] {
                                  ops::moe_route(logits, 2, false, Tensor(ex.data(), DType::i32, {2, 3}),
                                                 Tensor(w.data(), DType::bf16, {2, 2}));
                                }),
                                {"moe_route", "[2, 2]"});
}

namespace {

// A small MoE layer: E experts of width I over hidden H, random bf16 weights.
struct Layer {
  int64_t E, H, I;
  std::vector<bf16_t> router, gate_up, down;
  ops::MoeWeights view(int64_t k, bool norm) {
    ops::MoeWeights w;
    w.router = Tensor(router.data(), DType::bf16, {E, H});
    w.gate_up = Tensor(gate_up.data(), DType::bf16, {E, 2 * I, H});
    w.down = Tensor(down.data(), DType::bf16, {E, H, I});
    w.top_k = k;
    w.norm_topk_prob = norm;
    return w;
  }
};

Layer random_layer(int64_t E, int64_t H, int64_t I, uint32_t seed) {
  return {E,
          H,
          I,
          test_support::random_bf16(size_t(E * H), seed, -1, 1),
          test_support::random_bf16(size_t(E * 2 * I * H), seed + 1, -0.5f, 0.5f),
          test_support::random_bf16(size_t(E * H * I), seed + 2, -0.5f, 0.5f)};
}

std::vector<bf16_t> run_mlp(const std::vector<bf16_t>& x, Layer& L, int64_t k, bool norm) {
  const int64_t T = int64_t(x.size()) / L.H;
  std::vector<bf16_t> in = x, out(x.size());
  ops::moe_mlp(Tensor(in.data(), DType::bf16, {T, L.H}), L.view(k, norm),
               Tensor(out.data(), DType::bf16, {T, L.H}));
  return out;
}

// Exact dot product for the small-integer-valued inputs below (every partial sum is exact in fp32 and fp64).
double dot(const bf16_t* a, const bf16_t* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(bf16_to_f32(a[i])) * double(bf16_to_f32(b[i]));
  return s;
}

}  // namespace

// moe_mlp re-derived per token: the hand-computed routing weights above, each chosen expert's SwiGLU with the
// dense MLP's rounding points (all sums exact for these dyadic inputs), the weighted sum in fp32 in ascending
// expert index and one bf16 rounding.
TEST(MoeMlp, MatchesAHandDerivedTinyCase) {
  const int64_t E = 3, H = 4, I = 2, k = 2;
  Layer L{E, H, I, {}, {}, {}};
  // Router columns 0 and 1 give token 0 the logits (0, 1, 2) and token 1 (2, 2, 0).
  L.router = bf16s({0, 2, 0, 0, /**/ 1, 2, 0, 0, /**/ 2, 0, 0, 0});
  // Expert e: gate rows, then up rows, [2I, H]; down [H, I]. Dyadic values: every dot product is exact.
  L.gate_up =
      bf16s({1,    -2,   0.5f, 0, 0.25f, 1,    0, -1, /**/ 2, 0.5f, 0, 1, 1,     1, 1,    1,    // expert 0
             -1,   1.5f, 0,    0, 0.5f,  0.5f, 1, 0,  /**/ 1, -1,   0, 2, 0.75f, 0, 0,    1,    // expert 1
             0.5f, 0.5f, 1,    1, -0.5f, 2,    0, 0,  /**/ 1, 1,    0, 0, -1,    0, 0.5f, 0});  // expert 2
  L.down = bf16s({1,    0.5f,  -1,     0.25f, 0, 2, 0.5f,   0.5f,                               // expert 0
                  0.5f, -0.5f, 1,      1,     2, 0, 0.25f,  -1,                                 // expert 1
                  -1,   1,     0.125f, 0.5f,  1, 1, -0.25f, 0.75f});                            // expert 2
  const std::vector<bf16_t> x = bf16s({1, 0, 0.5f, -1, /**/ 0, 1, -0.5f, 2});
  // Hand-computed routing (see HandComputedWeightsWithAndWithoutRenormalization): token 0 takes experts 1
  // and 2 with 0.26953125 / 0.73046875; token 1 ties experts 0 and 1 at logit 2: 0.5 each.
  const int32_t chosen[2][2] = {{1, 2}, {0, 1}};
  const float weight[2][2] = {{0.26953125f, 0.73046875f}, {0.5f, 0.5f}};
  const std::vector<bf16_t> got = run_mlp(x, L, k, true);
  for (int t = 0; t < 2; ++t) {
    // y[j][h]: chosen expert j's output, bf16.
    float y[2][4];
    for (int j = 0; j < 2; ++j) {
      const int32_t e = chosen[t][j];
      const bf16_t* gu = L.gate_up.data() + e * 2 * I * H;
      float act[2];
      for (int64_t i = 0; i < I; ++i) {
        const float g = bf(dot(gu + i * H, x.data() + t * H, H));
        const float u = bf(dot(gu + (I + i) * H, x.data() + t * H, H));
        act[i] = bf(bf(g / (1.0f + std::exp(-g))) * u);
      }
      // Two products of bf16 values (exact in fp32), one fp32 add, one rounding: linear's result for K = 2.
      for (int64_t h = 0; h < H; ++h) {
        const bf16_t* d = L.down.data() + (e * H + h) * I;
        const float p0 = bf16_to_f32(d[0]) * act[0], p1 = bf16_to_f32(d[1]) * act[1];
        y[j][h] = bf(p0 + p1);
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      const float s = (0.0f + y[0][h] * weight[t][0]) + y[1][h] * weight[t][1];
      EXPECT_EQ(bf16_to_f32(got[size_t(t * H + h)]), bf(s)) << "token " << t << " column " << h;
    }
  }
}

// A token's output does not depend on which other tokens share the batch (and so share its experts).
TEST(MoeMlp, TokenRowsAreIndependentOfTheBatch) {
  Layer L = random_layer(8, 48, 24, 11);
  const int64_t T = 13, H = 48;
  const std::vector<bf16_t> x = test_support::random_bf16(size_t(T * H), 5);
  for (bool norm : {false, true}) {
    const std::vector<bf16_t> all = run_mlp(x, L, 3, norm);
    for (int64_t t : {0, 6, 12}) {
      const std::vector<bf16_t> one(x.begin() + t * H, x.begin() + (t + 1) * H);
      const std::vector<bf16_t> alone = run_mlp(one, L, 3, norm);
      EXPECT_EQ(0, std::memcmp(alone.data(), all.data() + t * H, size_t(H) * 2)) << "token " << t;
    }
  }
}

// An expert that no token chooses is never read: NaN weights there change nothing.
TEST(MoeMlp, AnUnchosenExpertIsNeverRead) {
  Layer L = random_layer(4, 16, 8, 3);
  // Router: expert 0 scores -8 x sum(x), the others +; with positive inputs it is never in the top 2.
  for (int64_t e = 0; e < 4; ++e)
    for (int64_t h = 0; h < 16; ++h) L.router[size_t(e * 16 + h)] = f32_to_bf16(e == 0 ? -8.0f : float(e));
  const std::vector<bf16_t> x = test_support::random_bf16(5 * 16, 9, 0.1f, 1.0f);
  const std::vector<bf16_t> clean = run_mlp(x, L, 2, false);
  const bf16_t nan = f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  std::fill(L.gate_up.begin(), L.gate_up.begin() + 2 * 8 * 16, nan);
  std::fill(L.down.begin(), L.down.begin() + 16 * 8, nan);
  const std::vector<bf16_t> poisoned = run_mlp(x, L, 2, false);
  EXPECT_EQ(0, std::memcmp(clean.data(), poisoned.data(), clean.size() * 2));
  for (bf16_t v : poisoned) EXPECT_TRUE(std::isfinite(bf16_to_f32(v)));
}

// moe_mlp with renormalization off gives weights below 1 (outputs shrink), on gives weights summing to ~1.
TEST(MoeMlp, RenormalizationChangesTheScaleAsSpecified) {
  Layer L = random_layer(6, 32, 16, 21);
  L.router = test_support::random_bf16(6 * 32, 22, -0.01f, 0.01f);  // near-uniform routing
  const std::vector<bf16_t> x = test_support::random_bf16(4 * 32, 2);
  const std::vector<bf16_t> off = run_mlp(x, L, 2, false), on = run_mlp(x, L, 2, true);
  double n_off = 0, n_on = 0;
  for (size_t i = 0; i < off.size(); ++i) {
    n_off += std::fabs(bf16_to_f32(off[i]));
    n_on += std::fabs(bf16_to_f32(on[i]));
  }
  EXPECT_GT(n_on, n_off * 1.2);  // top-2 of 6 near-uniform experts: p ~ 1/6 each unnormalized, 1/2 normalized
}

// moe_mlp with a ResidualNorm is add_rms_norm then moe_mlp, with out aliasing delta (the model's call).
TEST(MoeMlp, ResidualNormFormEqualsAddRmsNormThenMoeMlp) {
  const int64_t E = 8, H = 48, I = 24, k = 3, T = 4;
  Layer L = random_layer(E, H, I, 51);
  const ops::MoeWeights w = L.view(k, true);
  std::vector<bf16_t> delta = test_support::random_bf16(size_t(T * H), 52),
                      res = test_support::random_bf16(size_t(T * H), 53),
                      nw = test_support::random_bf16(size_t(H), 54), normed(size_t(T * H)),
                      out(size_t(T * H));
  std::vector<bf16_t> delta2 = delta, res2 = res, normed2(size_t(T * H));
  const auto mat = [&](std::vector<bf16_t>& v) { return Tensor(v.data(), DType::bf16, {T, H}); };
  const Tensor nwt(nw.data(), DType::bf16, {H});
  ops::add_rms_norm(mat(delta), mat(res), nwt, 1e-6f, mat(normed));
  ops::moe_mlp(mat(normed), w, mat(out));
  ops::moe_mlp(ops::ResidualNorm{mat(delta2), mat(res2), nwt, 1e-6f, mat(normed2)}, w, mat(delta2), Tensor());
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(delta2[i].bits, out[i].bits) << "out " << i;
    ASSERT_EQ(res2[i].bits, res[i].bits) << "residual " << i;
  }
  EXPECT_THROW(ops::moe_mlp(ops::ResidualNorm{mat(delta2), mat(res2), nwt, 1e-6f, mat(normed2)}, w, mat(res2),
                            Tensor()),
               Error)
      << "out aliasing residual";
}

TEST(MoeMlp, BadShapesNameTheTensor) {
  Layer L = random_layer(4, 16, 8, 1);
  std::vector<bf16_t> x(2 * 16), out(2 * 16);
  ops::MoeWeights w = L.view(2, false);
  w.down = Tensor(L.down.data(), DType::bf16, {4, 8, 16});  // [E, I, H]: transposed experts
  test_support::expect_contains(
      test_support::error_of([&] {
        ops::moe_mlp(Tensor(x.data(), DType::bf16, {2, 16}), w, Tensor(out.data(), DType::bf16, {2, 16}));
      }),
      {"moe_mlp", "down"});
}

// moe_mlp equals its contract composed from the other ops token by token (router logits, moe_route, each
// chosen expert's linear / silu_and_mul / linear, the fp32 sum in ascending expert index, one rounding): with
// top-3 the order of the sum matters, so a different order or an unrounded routing weight shows here.
TEST(MoeMlp, EqualsTheContractComposedTokenByToken) {
  const int64_t E = 8, H = 48, I = 24, k = 3, T = 9;
  Layer L = random_layer(E, H, I, 31);
  const std::vector<bf16_t> x = test_support::random_bf16(size_t(T * H), 32);
  for (bool norm : {false, true}) {
    const std::vector<bf16_t> got = run_mlp(x, L, k, norm);
    const ops::MoeWeights w = L.view(k, norm);
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<bf16_t> want = test_support::moe_compose_token(
          std::vector<bf16_t>(x.begin() + t * H, x.begin() + (t + 1) * H), w,
          [&](int64_t e, bool down, const Tensor& in, const Tensor& out) {
            ops::linear(in,
                        down ? Tensor(L.down.data() + e * H * I, DType::bf16, {H, I})
                             : Tensor(L.gate_up.data() + e * 2 * I * H, DType::bf16, {2 * I, H}),
                        out);
          });
      for (int64_t h = 0; h < H; ++h)
        ASSERT_EQ(bf16_to_f32(got[size_t(t * H + h)]), bf16_to_f32(want[size_t(h)]))
            << "token " << t << " column " << h << (norm ? " (renormalized)" : "");
    }
  }
}

// The weighted sum runs in ascending expert index: expert 0's output s is tiny, experts 1 and 2 give +L and
// -L exactly (same gate/up, negated down), all weighted 1/3. Ascending, (s + L) - L loses s and gives 0;
// any order that adds s after +L and -L cancel (e.g. descending) gives s.
TEST(MoeMlp, WeightedSumRunsInAscendingExpertIndex) {
  const int64_t E = 3, H = 32, I = 16;
  Layer L = random_layer(E, H, I, 41);
  std::fill(L.router.begin(), L.router.end(), f32_to_bf16(0.0f));  // equal logits: all three, 1/3 each
  std::copy(L.gate_up.begin() + 2 * I * H, L.gate_up.begin() + 4 * I * H, L.gate_up.begin() + 4 * I * H);
  for (int64_t i = 0; i < H * I; ++i) {
    const float d1 = bf16_to_f32(L.down[size_t(H * I + i)]);
    L.down[size_t(2 * H * I + i)] = f32_to_bf16(-d1);
    L.down[size_t(i)] = f32_to_bf16(std::ldexp(d1, -40));
  }
  const std::vector<bf16_t> x = test_support::random_bf16(size_t(4 * H), 42);
  const std::vector<bf16_t> got = run_mlp(x, L, 3, false);
  int nonzero_s = 0;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(bf16_to_f32(got[i]), 0.0f) << "element " << i;
  // The experiment has teeth: expert 0 alone is not zero.
  Layer only0 = L;
  for (int64_t i = H * I; i < 3 * H * I; ++i) only0.down[size_t(i)] = f32_to_bf16(0.0f);
  for (bf16_t v : run_mlp(x, only0, 3, false)) nonzero_s += bf16_to_f32(v) != 0.0f;
  EXPECT_GT(nonzero_s, int(got.size()) / 2);
}
