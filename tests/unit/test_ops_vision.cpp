// CPU reference ops of the Qwen3-VL vision tower (ops/layer_norm.h, activation.h gelu, linear.h linear_bias,
// rows.h, vision_attention.h) against fp64 transcriptions of their contracts, on odd sizes, with every output
// poisoned (NaN) first; and their argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/test_support.h"
#include "kiln/error.h"
#include "ops/activation.h"
#include "ops/layer_norm.h"
#include "ops/linear.h"
#include "ops/rows.h"
#include "ops/vision_attention.h"

using namespace kiln;

namespace {

using test_support::random_bf16;
std::vector<bf16_t> poisoned(size_t n) {
  return std::vector<bf16_t>(n, bf16_t{0x7fc1});
}
double f(bf16_t x) {
  return bf16_to_f32(x);
}
double rel_frob(const std::vector<bf16_t>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(std::isfinite(f(got[i]))) << "element " << i << " not written";
    num += (f(got[i]) - want[i]) * (f(got[i]) - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

TEST(OpsVision, LayerNormMatchesFp64) {
  for (int64_t H : {1, 7, 64, 200}) {
    const int64_t T = 5;
    auto x = random_bf16(size_t(T * H), 1, -3, 5), w = random_bf16(size_t(H), 2),
         b = random_bf16(size_t(H), 3);
    auto out = poisoned(size_t(T * H));
    ops::layer_norm(Tensor(x.data(), DType::bf16, {T, H}), Tensor(w.data(), DType::bf16, {H}),
                    Tensor(b.data(), DType::bf16, {H}), 1e-6f, Tensor(out.data(), DType::bf16, {T, H}));
    for (int64_t t = 0; t < T; ++t) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < H; ++i) mean += f(x[size_t(t * H + i)]) / double(H);
      for (int64_t i = 0; i < H; ++i) var += std::pow(f(x[size_t(t * H + i)]) - mean, 2) / double(H);
      for (int64_t i = 0; i < H; ++i) {
        const double want =
            (f(x[size_t(t * H + i)]) - mean) / std::sqrt(var + 1e-6) * f(w[size_t(i)]) + f(b[size_t(i)]);
        EXPECT_LE(std::fabs(f(out[size_t(t * H + i)]) - want),
                  std::ldexp(std::fabs(want), -7) + std::ldexp(1.0, -9))
            << "H " << H << " t " << t << " i " << i;
      }
    }
  }
}

TEST(OpsVision, GeluBothFormsMatchFp64) {
  const int64_t M = 3, N = 37;
  auto x = random_bf16(size_t(M * N), 4, -6, 6);
  for (auto approx : {ops::GeluApprox::none, ops::GeluApprox::tanh}) {
    auto out = poisoned(x.size());
    ops::gelu(Tensor(x.data(), DType::bf16, {M, N}), Tensor(out.data(), DType::bf16, {M, N}), approx);
    for (size_t i = 0; i < x.size(); ++i) {
      const double v = f(x[i]);
      const double want = approx == ops::GeluApprox::tanh
                              ? 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))
                              : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      // 1 bf16 ulp, plus what fp32 loses in 1 + tanh / 1 + erf for negative inputs (|x| 2^-23).
      const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(want), 1e-30)) - 7);
      EXPECT_LE(std::fabs(f(out[i]) - want), ulp + std::ldexp(std::fabs(v), -23)) << "x " << v;
    }
  }
  // The two forms differ (the config's hidden_act matters).
  auto a = poisoned(x.size()), b = poisoned(x.size());
  ops::gelu(Tensor(x.data(), DType::bf16, {M, N}), Tensor(a.data(), DType::bf16, {M, N}),
            ops::GeluApprox::none);
  ops::gelu(Tensor(x.data(), DType::bf16, {M, N}), Tensor(b.data(), DType::bf16, {M, N}),
            ops::GeluApprox::tanh);
  int differ = 0;
  for (size_t i = 0; i < x.size(); ++i) differ += a[i].bits != b[i].bits;
  EXPECT_GT(differ, 0);
}

TEST(OpsVision, LinearBiasMatchesFp64) {
  const int64_t M = 9, K = 1536, N = 13;
  auto x = random_bf16(size_t(M * K), 5), w = random_bf16(size_t(N * K), 6, -0.05f, 0.05f),
       b = random_bf16(size_t(N), 7);
  auto out = poisoned(size_t(M * N));
  ops::linear_bias(Tensor(x.data(), DType::bf16, {M, K}), Tensor(w.data(), DType::bf16, {N, K}),
                   Tensor(b.data(), DType::bf16, {N}), Tensor(out.data(), DType::bf16, {M, N}));
  std::vector<double> want(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = f(b[size_t(n)]);
      for (int64_t k = 0; k < K; ++k) s += f(x[size_t(m * K + k)]) * f(w[size_t(n * K + k)]);
      want[size_t(m * N + n)] = s;
    }
  EXPECT_LE(rel_frob(out, want), std::ldexp(1.0, -8));
  // The bias is really added: the same GEMM without it differs.
  auto plain = poisoned(size_t(M * N));
  ops::linear(Tensor(x.data(), DType::bf16, {M, K}), Tensor(w.data(), DType::bf16, {N, K}),
              Tensor(plain.data(), DType::bf16, {M, N}));
  EXPECT_NE(plain[0].bits, out[0].bits);
}

TEST(OpsVision, AddAndScatterRowsAreExact) {
  const int64_t T = 6, H = 11;
  auto a = random_bf16(size_t(T * H), 8), b = random_bf16(size_t(T * H), 9);
  auto out = poisoned(a.size());
  ops::add(Tensor(a.data(), DType::bf16, {T, H}), Tensor(b.data(), DType::bf16, {T, H}),
           Tensor(out.data(), DType::bf16, {T, H}));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i].bits, f32_to_bf16(float(f(a[i]) + f(b[i]))).bits);
  std::vector<int32_t> rows = {1, 4};
  auto src = random_bf16(size_t(2 * H), 10);
  for (bool acc : {false, true}) {
    auto dst = a;
    ops::scatter_rows(Tensor(dst.data(), DType::bf16, {T, H}), Tensor(rows.data(), DType::i32, {2}),
                      Tensor(src.data(), DType::bf16, {2, H}), acc);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < H; ++c) {
        const size_t i = size_t(t * H + c);
        const int r = t == 1 ? 0 : t == 4 ? 1 : -1;
        const uint16_t want = r < 0 ? a[i].bits
                              : acc ? f32_to_bf16(float(f(a[i]) + f(src[size_t(r * H + c)]))).bits
                                    : src[size_t(r * H + c)].bits;
        EXPECT_EQ(dst[i].bits, want) << "acc " << acc << " t " << t << " c " << c;
      }
  }
  std::vector<int32_t> bad = {6};
  auto dst = a;
  EXPECT_THROW(ops::scatter_rows(Tensor(dst.data(), DType::bf16, {T, H}), Tensor(bad.data(), DType::i32, {1}),
                                 Tensor(src.data(), DType::bf16, {1, H}), false),
               Error);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(dst[i].bits, a[i].bits) << "a failed scatter wrote";
}

TEST(OpsVision, Rope2dMatchesFp64AndPositionZeroIsIdentity) {
  const int Hn = 3, D = 24;
  const int64_t T = 4, P = 9;
  const Buffer tab = ops::build_rope_2d_table(D, 10000.0, P, Device::cpu());
  const ops::RopeTable2d table = ops::rope_2d_table_view(tab, D, P);
  auto qkv = random_bf16(size_t(T * 3 * Hn * D), 11);
  const auto orig = qkv;
  std::vector<int32_t> pos = {0, 0, 3, 7, 8, 1, 5, 5};
  ops::rope_2d(Tensor(qkv.data(), DType::bf16, {T, 3 * Hn * D}), Tensor(pos.data(), DType::i32, {T, 2}),
               table, Hn);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < 3 * Hn; ++h)
      for (int i = 0; i < D; ++i) {
        const size_t idx = size_t(t * 3 * Hn * D + h * D + i);
        if (h >= 2 * Hn || t == 0) {  // v untouched; position (0, 0) rotates by nothing
          EXPECT_EQ(qkv[idx].bits, orig[idx].bits);
          continue;
        }
        const int half = D / 2, Q = D / 4, j = i % half;
        const int p = pos[size_t(2 * t + (j < Q ? 0 : 1))];
        const double inv = 1.0 / std::pow(10000.0, double(2 * (j % Q)) / double(half));
        const double c = std::cos(p * inv), s = std::sin(p * inv);
        const size_t base = size_t(t * 3 * Hn * D + h * D);
        const double a = f(orig[base + size_t(j)]), b = f(orig[base + size_t(j + half)]);
        const double want = i < half ? a * c - b * s : b * c + a * s;
        EXPECT_LE(std::fabs(f(qkv[idx]) - want), std::ldexp(std::fabs(want), -7) + 1e-4)
            << t << " " << h << " " << i;
      }
  std::vector<int32_t> far = {0, 0, 9, 0, 0, 0, 0, 0};
  EXPECT_THROW(ops::rope_2d(Tensor(qkv.data(), DType::bf16, {T, 3 * Hn * D}),
                            Tensor(far.data(), DType::i32, {T, 2}), table, Hn),
               Error);
}

TEST(OpsVision, VarlenAttentionIsBidirectionalWithinSegmentsOnly) {
  const int64_t Hn = 2, D = 16, T = 13;
  std::vector<int32_t> cu = {0, 5, 5, 13};  // an empty segment in the middle
  // q, k, v inside one [T, 3, Hn, D] buffer, as the QKV GEMM writes them.
  auto qkv = random_bf16(size_t(T * 3 * Hn * D), 12);
  auto view = [&](std::vector<bf16_t>& buf, int k) {
    return Tensor::strided(buf.data() + k * Hn * D, DType::bf16, {T, Hn, D}, {3 * Hn * D, D, 1});
  };
  auto out = poisoned(size_t(T * Hn * D));
  const float scale = 0.25f;
  ops::varlen_attention(view(qkv, 0), view(qkv, 1), view(qkv, 2), Tensor(cu.data(), DType::i32, {4}),
                        Tensor(out.data(), DType::bf16, {T, Hn, D}), scale);
  std::vector<double> want(out.size());
  auto at = [&](int64_t t, int k, int64_t h, int64_t d) {
    return f(qkv[size_t(t * 3 * Hn * D + k * Hn * D + h * D + d)]);
  };
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t)
      for (int64_t h = 0; h < Hn; ++h) {
        std::vector<double> p;
        double mx = -1e300, den = 0;
        for (int64_t j = cu[s]; j < cu[s + 1]; ++j) {
          double sc = 0;
          for (int64_t d = 0; d < D; ++d) sc += at(t, 0, h, d) * at(j, 1, h, d);
          p.push_back(sc * scale);
          mx = std::max(mx, sc * scale);
        }
        for (double& x : p) den += (x = std::exp(x - mx));
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = cu[s]; j < cu[s + 1]; ++j) o += p[size_t(j - cu[s])] * at(j, 2, h, d);
          want[size_t((t * Hn + h) * D + d)] = o / den;
        }
      }
  EXPECT_LE(rel_frob(out, want), std::ldexp(1.0, -7));
  // Nothing crosses a segment: changing the last segment's K/V leaves the first segment's rows bitwise alone,
  // and the first row sees the segment's later rows (not causal).
  auto qkv2 = qkv;
  for (int64_t t = 5; t < T; ++t)
    for (int64_t c = Hn * D; c < 3 * Hn * D; ++c) qkv2[size_t(t * 3 * Hn * D + c)] = f32_to_bf16(1.5f);
  auto out2 = poisoned(out.size());
  ops::varlen_attention(view(qkv2, 0), view(qkv2, 1), view(qkv2, 2), Tensor(cu.data(), DType::i32, {4}),
                        Tensor(out2.data(), DType::bf16, {T, Hn, D}), scale);
  for (size_t i = 0; i < size_t(5 * Hn * D); ++i) EXPECT_EQ(out[i].bits, out2[i].bits);
  auto qkv3 = qkv;
  for (int64_t c = 2 * Hn * D; c < 3 * Hn * D; ++c) qkv3[size_t(4 * 3 * Hn * D + c)] = f32_to_bf16(3.0f);
  auto out3 = poisoned(out.size());
  ops::varlen_attention(view(qkv3, 0), view(qkv3, 1), view(qkv3, 2), Tensor(cu.data(), DType::i32, {4}),
                        Tensor(out3.data(), DType::bf16, {T, Hn, D}), scale);
  EXPECT_NE(out[0].bits, out3[0].bits) << "row 0 must attend to row 4 of its segment";
  std::vector<int32_t> bad = {0, 5, 12};
  EXPECT_THROW(
      ops::varlen_attention(view(qkv, 0), view(qkv, 1), view(qkv, 2), Tensor(bad.data(), DType::i32, {3}),
                            Tensor(out.data(), DType::bf16, {T, Hn, D}), scale),
      Error);
  // `stop`: never true, the same bits; true at once, the op returns with (row 0, head 0) unwritten.
  auto out4 = poisoned(out.size());
  int polls = 0;
  ops::varlen_attention(view(qkv, 0), view(qkv, 1), view(qkv, 2), Tensor(cu.data(), DType::i32, {4}),
                        Tensor(out4.data(), DType::bf16, {T, Hn, D}), scale, [&] { return ++polls < 0; });
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out4[i].bits, out[i].bits) << i;
  EXPECT_GE(polls, 1);
  auto out5 = poisoned(out.size());
  const auto poison = poisoned(1)[0].bits;
  ops::varlen_attention(view(qkv, 0), view(qkv, 1), view(qkv, 2), Tensor(cu.data(), DType::i32, {4}),
                        Tensor(out5.data(), DType::bf16, {T, Hn, D}), scale, [] { return true; });
  for (int64_t d = 0; d < D; ++d) EXPECT_EQ(out5[size_t(d)].bits, poison) << d;
}

}  // namespace
