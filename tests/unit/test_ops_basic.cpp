// CPU reference ops: embedding, RMSNorm, fused add + RMSNorm, SiLU-and-multiply. Hand-checked values
// and an fp64 transcription of each contract (1 bf16 ulp allowed where fp64 vs fp32 may round apart).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/test_support.h"
#include "ops/activation.h"
#include "ops/argmax.h"
#include "ops/cpu/parallel.h"
#include "ops/embedding.h"
#include "ops/rms_norm.h"

using namespace kiln;

namespace {

using test_support::random_bf16;
float f(bf16_t x) {
  return bf16_to_f32(x);
}
double round_bf16(double x) {
  return bf16_to_f32(f32_to_bf16(float(x)));
}
// Distance in bf16 ulps between two finite bf16 values of the same sign (or zero).
int ulp_diff(bf16_t a, bf16_t b) {
  auto key = [](bf16_t x) { return (x.bits & 0x8000) ? -int(x.bits & 0x7fff) : int(x.bits); };
  return std::abs(key(a) - key(b));
}

}  // namespace

TEST(OpsEmbedding, GathersRowsAndWidens) {
  const int64_t V = 7, H = 5;
  auto table = random_bf16(V * H, 1);
  std::vector<int32_t> ids = {6, 0, 3, 3};
  std::vector<bf16_t> out(ids.size() * H);
  std::vector<float> out32(ids.size() * H);
  ops::embedding(Tensor(table.data(), DType::bf16, {V, H}), Tensor(ids.data(), DType::i32, {4}),
                 Tensor(out.data(), DType::bf16, {4, H}));
  ops::embedding(Tensor(table.data(), DType::bf16, {V, H}), Tensor(ids.data(), DType::i32, {4}),
                 Tensor(out32.data(), DType::f32, {4, H}));
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t i = 0; i < H; ++i) {
      EXPECT_EQ(out[t * H + i].bits, table[ids[t] * H + i].bits);
      EXPECT_EQ(out32[t * H + i], f(table[ids[t] * H + i]));
    }
  }
}

TEST(OpsEmbedding, RejectsOutOfRangeIdsAndBadShapes) {
  std::vector<bf16_t> table(4 * 3);
  std::vector<int32_t> ids = {1, 4};
  std::vector<bf16_t> out(2 * 3);
  EXPECT_THROW(ops::embedding(Tensor(table.data(), DType::bf16, {4, 3}), Tensor(ids.data(), DType::i32, {2}),
                              Tensor(out.data(), DType::bf16, {2, 3})),
               Error);
  ids[1] = -1;
  EXPECT_THROW(ops::embedding(Tensor(table.data(), DType::bf16, {4, 3}), Tensor(ids.data(), DType::i32, {2}),
                              Tensor(out.data(), DType::bf16, {2, 3})),
               Error);
  ids[1] = 0;
  EXPECT_THROW(ops::embedding(Tensor(table.data(), DType::bf16, {4, 3}), Tensor(ids.data(), DType::i32, {2}),
                              Tensor(out.data(), DType::bf16, {2, 2})),
               Error);
  EXPECT_THROW(ops::embedding(Tensor(table.data(), DType::f32, {4, 3}), Tensor(ids.data(), DType::i32, {2}),
                              Tensor(out.data(), DType::bf16, {2, 3})),
               Error);
}

TEST(OpsRmsNorm, HandChecked) {
  // x = [1, 2, 3, 4]: mean(x^2) = 7.5, r = 1/sqrt(7.5) = 0.3651484; x * r = 0.3651, 0.7303, 1.0954, 1.4606.
  // bf16 (8 significant bits): 0.365234375, 0.73046875, 1.09375, 1.4609375. With w = 2: doubled exactly.
  std::vector<bf16_t> x = {f32_to_bf16(1), f32_to_bf16(2), f32_to_bf16(3), f32_to_bf16(4)};
  std::vector<bf16_t> w(4, f32_to_bf16(2.0f)), out(4);
  ops::rms_norm(Tensor(x.data(), DType::bf16, {1, 4}), Tensor(w.data(), DType::bf16, {4}), 1e-6f,
                Tensor(out.data(), DType::bf16, {1, 4}));
  const float want[4] = {0.73046875f, 1.4609375f, 2.1875f, 2.921875f};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(f(out[i]), want[i]) << i;
}

TEST(OpsRmsNorm, MatchesFp64ReferenceOddSizes) {
  for (int64_t H : {1, 7, 33, 257, 1000}) {
    const int64_t T = 3;
    auto x = random_bf16(T * H, uint32_t(H));
    auto w = random_bf16(H, uint32_t(H + 1), 0.5f, 1.5f);
    std::vector<bf16_t> out(T * H);
    const float eps = 1e-6f;
    ops::rms_norm(Tensor(x.data(), DType::bf16, {T, H}), Tensor(w.data(), DType::bf16, {H}), eps,
                  Tensor(out.data(), DType::bf16, {T, H}));
    int off = 0;
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < H; ++i) ss += double(f(x[t * H + i])) * f(x[t * H + i]);
      const double r = 1.0 / std::sqrt(ss / double(H) + double(eps));
      for (int64_t i = 0; i < H; ++i) {
        const double want = round_bf16(round_bf16(f(x[t * H + i]) * r) * f(w[i]));
        const int d = ulp_diff(out[t * H + i], f32_to_bf16(float(want)));
        EXPECT_LE(d, 1) << "H " << H << " t " << t << " i " << i;
        off += d;
      }
    }
    EXPECT_LE(off, std::max<int64_t>(2, T * H / 50)) << "too many 1-ulp differences at H " << H;
  }
}

TEST(OpsRmsNorm, CanonicalSumOrder) {
  // 64 values: lane 0 owns elements 0..7, lane 1 owns 8..15, ...; the butterfly adds lanes pairwise.
  std::vector<float> v(300);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-3, 3);
  for (auto& x : v) x = d(rng);
  float p[32] = {};
  for (size_t i = 0; i < v.size(); ++i) p[(i / 8) % 32] = std::fma(v[i], v[i], p[(i / 8) % 32]);
  for (int o = 16; o >= 1; o /= 2) {
    float q[32];
    for (int l = 0; l < 32; ++l) q[l] = p[l] + p[l ^ o];
    std::copy(q, q + 32, p);
  }
  EXPECT_EQ(ops::rms_sum_squares(v.data(), int64_t(v.size())), p[0]);
  double exact = 0;
  for (float x : v) exact += double(x) * x;
  EXPECT_NEAR(p[0], exact, exact * 1e-6);
}

TEST(OpsAddRmsNorm, UpdatesResidualAndNormalises) {
  const int64_t T = 5, H = 67;
  auto x = random_bf16(T * H, 11), res = random_bf16(T * H, 12), w = random_bf16(H, 13, 0.5f, 1.5f);
  auto res0 = res;
  std::vector<bf16_t> out(T * H), want(T * H);
  ops::add_rms_norm(Tensor(x.data(), DType::bf16, {T, H}), Tensor(res.data(), DType::bf16, {T, H}),
                    Tensor(w.data(), DType::bf16, {H}), 1e-5f, Tensor(out.data(), DType::bf16, {T, H}));
  for (int64_t i = 0; i < T * H; ++i) {
    ASSERT_EQ(res[i].bits, f32_to_bf16(f(res0[i]) + f(x[i])).bits) << i;
  }
  // The fused op equals the residual add followed by the plain norm, bit for bit.
  ops::rms_norm(Tensor(res.data(), DType::bf16, {T, H}), Tensor(w.data(), DType::bf16, {H}), 1e-5f,
                Tensor(want.data(), DType::bf16, {T, H}));
  for (int64_t i = 0; i < T * H; ++i) ASSERT_EQ(out[i].bits, want[i].bits) << i;
  EXPECT_THROW(
      ops::add_rms_norm(Tensor(x.data(), DType::bf16, {T, H}), Tensor(res.data(), DType::bf16, {T, H}),
                        Tensor(w.data(), DType::bf16, {H}), 1e-5f, Tensor(res.data(), DType::bf16, {T, H})),
      Error);
  EXPECT_THROW(ops::rms_norm(Tensor(x.data(), DType::bf16, {T, H}), Tensor(w.data(), DType::bf16, {H - 1}),
                             1e-5f, Tensor(out.data(), DType::bf16, {T, H})),
               Error);
}

TEST(OpsSiluAndMul, HandCheckedAndFp64) {
  // g = 0: silu = 0; g = 2: 2 / (1 + e^-2) = 1.7615942 -> bf16 1.7578125 (225/128); times u = 0.5 ->
  // 0.87890625.
  std::vector<bf16_t> gu = {f32_to_bf16(0), f32_to_bf16(2), f32_to_bf16(3), f32_to_bf16(0.5f)};
  std::vector<bf16_t> out(2);
  ops::silu_and_mul(Tensor(gu.data(), DType::bf16, {1, 4}), Tensor(out.data(), DType::bf16, {1, 2}));
  EXPECT_EQ(f(out[0]), 0.0f);
  EXPECT_EQ(f(out[1]), 0.87890625f);

  const int64_t M = 9, I = 131;
  auto g = random_bf16(M * 2 * I, 21, -6, 6);
  std::vector<bf16_t> o(M * I);
  ops::silu_and_mul(Tensor(g.data(), DType::bf16, {M, 2 * I}), Tensor(o.data(), DType::bf16, {M, I}));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t i = 0; i < I; ++i) {
      const double gv = f(g[m * 2 * I + i]), uv = f(g[m * 2 * I + I + i]);
      const double want = round_bf16(round_bf16(gv / (1.0 + std::exp(-gv))) * uv);
      EXPECT_LE(ulp_diff(o[m * I + i], f32_to_bf16(float(want))), 1) << m << "," << i;
    }
  }
  EXPECT_THROW(
      ops::silu_and_mul(Tensor(g.data(), DType::bf16, {M, 2 * I}), Tensor(o.data(), DType::bf16, {M, I - 1})),
      Error);
}

TEST(OpsParallelFor, CoversEachIndexOnceAndPropagatesErrors) {
  for (int64_t n : {0, 1, 7, 1000}) {
    for (int64_t grain : {1, 3, 64, 5000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      ops::cpu::parallel_for(n, grain, [&](int64_t b, int64_t e) {
        EXPECT_LE(e - b, grain);
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
        // A nested call runs inline on this thread.
        ops::cpu::parallel_for(3, 1, [&](int64_t, int64_t) {});
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << n << "," << grain << "," << i;
    }
  }
  EXPECT_THROW(ops::cpu::parallel_for(100, 1,
                                      [](int64_t b, int64_t) {
                                        if (b == 57) KILN_FAIL("boom");
                                      }),
               Error);
  // The pool still works after an exception.
  std::atomic<int64_t> sum{0};
  ops::cpu::parallel_for(100, 7, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(OpsArgmaxRows, HandCheckedTiesNanAndOffsets) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // Rows of 5 in a row stride of 6 (the sixth column, 100, must never be read).
  std::vector<float> x = {1,    3,   2,    3,   0,    100,  // tie: the lower index, 1
                          nan,  -1,  -2,   -1,  -5,   100,  // NaN ranks below every number: 1
                          -inf, nan, -inf, nan, -inf, 100,  // nothing above -inf: 0
                          0,    0,   0,    0,   7,    100};
  const Tensor logits = Tensor::strided(x.data(), DType::f32, {4, 5}, {6, 1}, Device::cpu());
  std::vector<int32_t> out(4, -7);
  ops::argmax_rows(logits, Tensor(), Tensor(out.data(), DType::i32, {4}, Device::cpu()));
  EXPECT_EQ(out, (std::vector<int32_t>{1, 1, 0, 4}));
  std::vector<int64_t> d2t = {10, 20, 30, 40, -4};  // id + d2t[id]
  ops::argmax_rows(logits, Tensor(d2t.data(), DType::i64, {5}, Device::cpu()),
                   Tensor(out.data(), DType::i32, {4}, Device::cpu()));
  EXPECT_EQ(out, (std::vector<int32_t>{21, 21, 10, 0}));
}

TEST(OpsArgmaxRows, RejectsBadShapes) {
  std::vector<float> x(12, 0.0f);
  std::vector<int32_t> out(3);
  std::vector<int64_t> d2t(3);
  const Tensor logits(x.data(), DType::f32, {3, 4}, Device::cpu());
  EXPECT_THROW(ops::argmax_rows(logits, Tensor(), Tensor(out.data(), DType::i32, {2}, Device::cpu())), Error);
  EXPECT_THROW(ops::argmax_rows(logits, Tensor(d2t.data(), DType::i64, {3}, Device::cpu()),
                                Tensor(out.data(), DType::i32, {3}, Device::cpu())),
               Error);
  EXPECT_THROW(ops::argmax_rows(Tensor(x.data(), DType::bf16, {3, 4}, Device::cpu()), Tensor(),
                                Tensor(out.data(), DType::i32, {3}, Device::cpu())),
               Error);
}
