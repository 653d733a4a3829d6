// CPU linear, LM head and the fused ops (linear_silu_mul, linear_add_rms_norm: exactly their compositions):
// hand-checked values, an fp64 reference over odd sizes, and the batch invariance the model's bitwise tests
// rely on.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/activation.h"
#include "ops/cpu/reference.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"

using namespace kiln;

namespace {

std::vector<bf16_t> random_bf16(size_t n, uint32_t seed, float a = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-a, a);
  std::vector<bf16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}
float f(bf16_t x) {
  return bf16_to_f32(x);
}

// Relative Frobenius error of `got` against the fp64 product.
double rel_error(const std::vector<bf16_t>& x, const std::vector<bf16_t>& w, int64_t M, int64_t N, int64_t K,
                 const std::vector<double>& got) {
  double num = 0, den = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(f(x[m * K + k])) * f(w[n * K + k]);
      num += (got[m * N + n] - s) * (got[m * N + n] - s);
      den += s * s;
    }
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace

TEST(OpsLinear, HandChecked) {
  // x = [[1, 2], [3, 4]], W = [[1, 0], [0.5, 0.25], [-1, 1]] -> [[1, 1, 1], [3, 2.5, 1]]
  std::vector<bf16_t> x = {f32_to_bf16(1), f32_to_bf16(2), f32_to_bf16(3), f32_to_bf16(4)};
  std::vector<bf16_t> w = {f32_to_bf16(1),     f32_to_bf16(0),  f32_to_bf16(0.5f),
                           f32_to_bf16(0.25f), f32_to_bf16(-1), f32_to_bf16(1)};
  std::vector<bf16_t> out(6);
  ops::linear(Tensor(x.data(), DType::bf16, {2, 2}), Tensor(w.data(), DType::bf16, {3, 2}),
              Tensor(out.data(), DType::bf16, {2, 3}));
  const float want[6] = {1, 1, 1, 3, 2.5f, 1};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f(out[i]), want[i]) << i;
}

TEST(OpsLinear, MatchesFp64OddSizes) {
  for (int64_t M : {1, 3, 67}) {
    for (int64_t N : {1, 5, 133}) {
      for (int64_t K : {1, 7, 300}) {
        auto x = random_bf16(M * K, uint32_t(M * 1000 + K));
        auto w = random_bf16(N * K, uint32_t(N * 7 + K));
        std::vector<bf16_t> out(M * N);
        ops::linear(Tensor(x.data(), DType::bf16, {M, K}), Tensor(w.data(), DType::bf16, {N, K}),
                    Tensor(out.data(), DType::bf16, {M, N}));
        std::vector<double> got(out.size());
        for (size_t i = 0; i < out.size(); ++i) got[i] = f(out[i]);
        EXPECT_LE(rel_error(x, w, M, N, K, got), std::ldexp(1.0, -8)) << M << "x" << N << "x" << K;
      }
    }
  }
}

TEST(OpsLinear, RowResultIndependentOfBatchAndStrides) {
  const int64_t M = 37, N = 203, K = 129;
  auto x = random_bf16(M * K, 3), w = random_bf16(N * K, 4);
  std::vector<bf16_t> all(M * N);
  ops::linear(Tensor(x.data(), DType::bf16, {M, K}), Tensor(w.data(), DType::bf16, {N, K}),
              Tensor(all.data(), DType::bf16, {M, N}));
  for (int64_t m : {0, 17, 36}) {
    // One row alone, written into a strided output.
    std::vector<bf16_t> one(2 * N);
    ops::linear(Tensor(x.data() + m * K, DType::bf16, {1, K}), Tensor(w.data(), DType::bf16, {N, K}),
                Tensor::strided(one.data(), DType::bf16, {1, N}, {2 * N, 1}));
    for (int64_t n = 0; n < N; ++n) ASSERT_EQ(one[n].bits, all[m * N + n].bits) << m << "," << n;
  }
}

TEST(OpsLinear, RejectsBadShapes) {
  std::vector<bf16_t> x(6), w(6), out(6);
  EXPECT_THROW(ops::linear(Tensor(x.data(), DType::bf16, {2, 3}), Tensor(w.data(), DType::bf16, {3, 2}),
                           Tensor(out.data(), DType::bf16, {2, 3})),
               Error);
  EXPECT_THROW(ops::linear(Tensor(x.data(), DType::bf16, {2, 3}), Tensor(w.data(), DType::bf16, {2, 3}),
                           Tensor(out.data(), DType::bf16, {2, 3})),
               Error);
  EXPECT_THROW(ops::linear(Tensor(x.data(), DType::f32, {1, 3}), Tensor(w.data(), DType::bf16, {2, 3}),
                           Tensor(out.data(), DType::bf16, {1, 2})),
               Error);
}

TEST(OpsLmHead, GathersRowsRoundsToBf16) {
  const int64_t T = 6, H = 45, V = 301;
  auto x = random_bf16(T * H, 8), w = random_bf16(V * H, 9);
  std::vector<int32_t> rows = {1, 5};
  std::vector<float> logits(rows.size() * V);
  ops::lm_head(Tensor(x.data(), DType::bf16, {T, H}), Tensor(rows.data(), DType::i32, {2}),
               Tensor(w.data(), DType::bf16, {V, H}), Tensor(logits.data(), DType::f32, {2, V}));
  std::vector<bf16_t> ref(T * V);
  ops::linear(Tensor(x.data(), DType::bf16, {T, H}), Tensor(w.data(), DType::bf16, {V, H}),
              Tensor(ref.data(), DType::bf16, {T, V}));
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int64_t v = 0; v < V; ++v) {
      // The stored f32 is a bf16 value, equal to linear's bf16 result.
      ASSERT_EQ(logits[r * V + v], f(ref[rows[r] * V + v])) << r << "," << v;
    }
  }
  rows[1] = int32_t(T);
  EXPECT_THROW(ops::lm_head(Tensor(x.data(), DType::bf16, {T, H}), Tensor(rows.data(), DType::i32, {2}),
                            Tensor(w.data(), DType::bf16, {V, H}), Tensor(logits.data(), DType::f32, {2, V})),
               Error);
}

TEST(OpsLinear, Avx2AndBaselineKernelsAgreeBitwise) {
  if (!ops::cpu::linear_uses_avx2()) GTEST_SKIP() << "this CPU has no AVX2: only the baseline kernel runs";
  const int64_t M = 5, N = 77, K = 203;
  auto x = random_bf16(M * K, 31), w = random_bf16(N * K, 32);
  std::vector<bf16_t> a(M * N), b(M * N);
  ops::linear(Tensor(x.data(), DType::bf16, {M, K}), Tensor(w.data(), DType::bf16, {N, K}),
              Tensor(a.data(), DType::bf16, {M, N}));
  ops::cpu::linear_force_baseline(true);
  ops::linear(Tensor(x.data(), DType::bf16, {M, K}), Tensor(w.data(), DType::bf16, {N, K}),
              Tensor(b.data(), DType::bf16, {M, N}));
  ops::cpu::linear_force_baseline(false);
  for (int64_t i = 0; i < M * N; ++i) ASSERT_EQ(a[i].bits, b[i].bits) << i;
}

// linear_silu_mul (the reference for the fused gate_up GEMV): exactly linear into gate_up, then
// silu_and_mul; a hand-checked value; bad shapes and aliasing rejected.
TEST(OpsLinearSiluMul, IsLinearThenSiluAndMulBitwise) {
  const int64_t M = 3, I = 24, K = 40, N = 2 * I;
  const auto x = random_bf16(size_t(M * K), 91), w = random_bf16(size_t(N * K), 92, 0.3f);
  std::vector<bf16_t> gu(size_t(M * N)), act(size_t(M * I)), gu_ref(size_t(M * N)), act_ref(size_t(M * I));
  const Tensor tx(const_cast<bf16_t*>(x.data()), DType::bf16, {M, K}),
      tw(const_cast<bf16_t*>(w.data()), DType::bf16, {N, K});
  ops::linear_silu_mul(tx, tw, Tensor(gu.data(), DType::bf16, {M, N}),
                       Tensor(act.data(), DType::bf16, {M, I}));
  ops::linear(tx, tw, Tensor(gu_ref.data(), DType::bf16, {M, N}));
  ops::silu_and_mul(Tensor(gu_ref.data(), DType::bf16, {M, N}), Tensor(act_ref.data(), DType::bf16, {M, I}));
  for (size_t i = 0; i < act.size(); ++i) EXPECT_EQ(act[i].bits, act_ref[i].bits) << i;
}

TEST(OpsLinearSiluMul, HandChecked) {
  // x = [1, 2]; gate row [1, 0] -> g = 1; up row [0, 0.5] -> u = 1.
  // silu(1) = 0.7310586 -> bf16 0.73046875; times u = 1 -> 0.73046875.
  std::vector<bf16_t> x = {f32_to_bf16(1), f32_to_bf16(2)};
  std::vector<bf16_t> w = {f32_to_bf16(1), f32_to_bf16(0), f32_to_bf16(0), f32_to_bf16(0.5f)};
  std::vector<bf16_t> gu(2), act(1);
  ops::linear_silu_mul(Tensor(x.data(), DType::bf16, {1, 2}), Tensor(w.data(), DType::bf16, {2, 2}),
                       Tensor(gu.data(), DType::bf16, {1, 2}), Tensor(act.data(), DType::bf16, {1, 1}));
  EXPECT_EQ(f(act[0]), 0.73046875f);
}

TEST(OpsLinearSiluMul, RejectsBadShapes) {
  std::vector<bf16_t> x(2 * 8), w(6 * 8), gu(2 * 6), act(2 * 3), wodd(5 * 8);
  const Tensor tx(x.data(), DType::bf16, {2, 8}), tw(w.data(), DType::bf16, {6, 8});
  const Tensor tgu(gu.data(), DType::bf16, {2, 6}), tact(act.data(), DType::bf16, {2, 3});
  EXPECT_NO_THROW(ops::linear_silu_mul(tx, tw, tgu, tact));
  EXPECT_THROW(ops::linear_silu_mul(tx, Tensor(wodd.data(), DType::bf16, {5, 8}),
                                    Tensor(gu.data(), DType::bf16, {2, 5}), tact),
               Error);  // 2I odd
  EXPECT_THROW(ops::linear_silu_mul(tx, tw, tgu, Tensor(act.data(), DType::bf16, {2, 2})),
               Error);  // out [M, I]
  EXPECT_THROW(ops::linear_silu_mul(tx, tw, Tensor(gu.data(), DType::bf16, {2, 4}), tact), Error);  // gate_up
  EXPECT_THROW(ops::linear_silu_mul(tx, Tensor(w.data(), DType::bf16, {6, 4}), tgu, tact), Error);  // K
  EXPECT_THROW(ops::linear_silu_mul(tx, tw, tgu, Tensor(gu.data(), DType::bf16, {2, 3})),
               Error);  // out aliases
}

TEST(OpsLinearAddRmsNorm, IsLinearThenAddRmsNormBitwise) {
  const int64_t M = 3, N = 48, K = 40;
  const float eps = 1e-6f;
  const auto x = random_bf16(size_t(M * K), 93), w = random_bf16(size_t(N * K), 94, 0.3f);
  const auto res0 = random_bf16(size_t(M * N), 95, 2.0f), nw = random_bf16(size_t(N), 96, 1.5f);
  std::vector<bf16_t> tmp(size_t(M * N)), res(res0), normed(size_t(M * N));
  std::vector<bf16_t> tmp_ref(size_t(M * N)), res_ref(res0), normed_ref(size_t(M * N));
  const Tensor tx(const_cast<bf16_t*>(x.data()), DType::bf16, {M, K}),
      tw(const_cast<bf16_t*>(w.data()), DType::bf16, {N, K}),
      tnw(const_cast<bf16_t*>(nw.data()), DType::bf16, {N});
  ops::linear_add_rms_norm(tx, tw, Tensor(res.data(), DType::bf16, {M, N}), tnw, eps,
                           Tensor(tmp.data(), DType::bf16, {M, N}),
                           Tensor(normed.data(), DType::bf16, {M, N}));
  ops::linear(tx, tw, Tensor(tmp_ref.data(), DType::bf16, {M, N}));
  ops::add_rms_norm(Tensor(tmp_ref.data(), DType::bf16, {M, N}), Tensor(res_ref.data(), DType::bf16, {M, N}),
                    tnw, eps, Tensor(normed_ref.data(), DType::bf16, {M, N}));
  for (size_t i = 0; i < tmp.size(); ++i) {
    EXPECT_EQ(tmp[i].bits, tmp_ref[i].bits) << "tmp " << i;
    EXPECT_EQ(res[i].bits, res_ref[i].bits) << "residual " << i;
    EXPECT_EQ(normed[i].bits, normed_ref[i].bits) << "normed " << i;
  }
  bool updated = false;  // the residual was rewritten
  for (size_t i = 0; i < res.size(); ++i) updated |= res[i].bits != res0[i].bits;
  EXPECT_TRUE(updated);
}

TEST(OpsLinearAddRmsNorm, HandChecked) {
  // x = [1, 2]; W = [[1, 0], [0, 0.5]] -> tmp = [1, 1]; residual [1, 3] -> [2, 4].
  // ss = 4 + 16 = 20, mean 10, inv = 1 / sqrt(10 + eps) = 0.31622776; norm weight [1, 0.5]:
  // normed = [bf16(0.6324555) = 0.6328125, bf16(1.264911) = 1.265625 times 0.5 = 0.6328125].
  std::vector<bf16_t> x = {f32_to_bf16(1), f32_to_bf16(2)};
  std::vector<bf16_t> w = {f32_to_bf16(1), f32_to_bf16(0), f32_to_bf16(0), f32_to_bf16(0.5f)};
  std::vector<bf16_t> res = {f32_to_bf16(1), f32_to_bf16(3)}, nw = {f32_to_bf16(1), f32_to_bf16(0.5f)};
  std::vector<bf16_t> tmp(2), normed(2);
  ops::linear_add_rms_norm(Tensor(x.data(), DType::bf16, {1, 2}), Tensor(w.data(), DType::bf16, {2, 2}),
                           Tensor(res.data(), DType::bf16, {1, 2}), Tensor(nw.data(), DType::bf16, {2}),
                           1e-6f, Tensor(tmp.data(), DType::bf16, {1, 2}),
                           Tensor(normed.data(), DType::bf16, {1, 2}));
  EXPECT_EQ(f(tmp[0]), 1.0f);
  EXPECT_EQ(f(tmp[1]), 1.0f);
  EXPECT_EQ(f(res[0]), 2.0f);
  EXPECT_EQ(f(res[1]), 4.0f);
  EXPECT_EQ(f(normed[0]), 0.6328125f);
  EXPECT_EQ(f(normed[1]), 0.6328125f);
}

TEST(OpsLinearAddRmsNorm, RejectsBadShapes) {
  std::vector<bf16_t> x(2 * 8), w(6 * 8), res(2 * 6), nw(6), tmp(2 * 6), normed(2 * 6), other(2 * 6);
  const Tensor tx(x.data(), DType::bf16, {2, 8}), tw(w.data(), DType::bf16, {6, 8});
  const Tensor tres(res.data(), DType::bf16, {2, 6}), tnw(nw.data(), DType::bf16, {6});
  const Tensor ttmp(tmp.data(), DType::bf16, {2, 6}), tnormed(normed.data(), DType::bf16, {2, 6});
  EXPECT_NO_THROW(ops::linear_add_rms_norm(tx, tw, tres, tnw, 1e-6f, ttmp, tnormed));
  EXPECT_THROW(
      ops::linear_add_rms_norm(tx, Tensor(w.data(), DType::bf16, {6, 4}), tres, tnw, 1e-6f, ttmp, tnormed),
      Error);  // K
  EXPECT_THROW(
      ops::linear_add_rms_norm(tx, tw, Tensor(res.data(), DType::bf16, {2, 5}), tnw, 1e-6f, ttmp, tnormed),
      Error);  // residual [M, N]
  EXPECT_THROW(
      ops::linear_add_rms_norm(tx, tw, tres, Tensor(nw.data(), DType::bf16, {5}), 1e-6f, ttmp, tnormed),
      Error);                                                                             // norm weight [N]
  EXPECT_THROW(ops::linear_add_rms_norm(tx, tw, tres, tnw, 0.0f, ttmp, tnormed), Error);  // eps
  EXPECT_THROW(
      ops::linear_add_rms_norm(tx, tw, tres, tnw, 1e-6f, ttmp, Tensor(other.data(), DType::bf16, {2, 5})),
      Error);                                                                           // normed [M, N]
  EXPECT_THROW(ops::linear_add_rms_norm(tx, tw, tres, tnw, 1e-6f, ttmp, ttmp), Error);  // normed aliases tmp
  EXPECT_THROW(ops::linear_add_rms_norm(tx, tw, tres, tnw, 1e-6f, tres, tnormed),
               Error);  // tmp aliases residual
}
