// The block-FP8 linear oracle (ops/fp8_linear.h, docs/NUMERICS.md "Block-FP8 linear layers"): a hand-checked
// 2 x 256 . 256 x 3 case in both paths, the e4m3 encoder's edge cases, the activation and weight quantizers,
// ragged shapes against an fp64 reference of the same quantized operands, and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/test_support.h"
#include "ops/cpu/fp8_ref.h"
#include "ops/fp8.h"
#include "ops/fp8_linear.h"
#include "ops/linear.h"

using namespace kiln;
using kiln::test_support::error_of;
using kiln::test_support::expect_contains;

namespace {

float bf(bf16_t v) {
  return bf16_to_f32(v);
}

// W8A8 and weight-only on a case whose every step is exact but the final bf16 rounding, worked by hand:
//   x row 0: k = 0: 448, k = 1..127: 1 (group scale 448/448 = 1); k = 128: 224, k = 129..255: -0.5 (scale
//   0.5:
//            q = 448, -1). Row 1: block 0 all zero (q = 0); k = 200: -7, the rest of block 1: 0.875 (scale
//            7/448 = 1/64: q = -448, 56).
//   W (one block row, two block columns; scales 0.25 and 2): row 0 q = 1; row 1 q = +2 at even k, -2 at odd
//   k; row 2 q = 448 at k = 0, 0.5 at k = 200, else 0. out[0, 0] = 575 * 0.25 + 321 * (0.5 * 2) = 464.75 ->
//   bf16 464      (ulp 2 in [256, 512)) out[0, 1] = 894 * 0.25 + 898 * 1 = 1121.5 -> 1120 (ulp 8) out[0, 2] =
//   200704 * 0.25 + (-0.5) * 1 = 50175.5 -> 50176         (ulp 256) out[1, 0] = 0 + (-448 + 127 * 56) / 32 =
//   208.25 -> 208 out[1, 1] = (-896 + 63 * 112 - 64 * 112) / 32 = -31.5 out[1, 2] = (-448 * 0.5) / 32 = -7
struct HandCase {
  std::vector<bf16_t> x = std::vector<bf16_t>(2 * 256);
  std::vector<uint8_t> q = std::vector<uint8_t>(3 * 256);
  std::vector<float> s = {0.25f, 2.0f};
  HandCase() {
    for (int k = 0; k < 256; ++k) {
      x[size_t(k)] = f32_to_bf16(k == 0 ? 448.f : k < 128 ? 1.f : k == 128 ? 224.f : -0.5f);
      x[size_t(256 + k)] = f32_to_bf16(k < 128 ? 0.f : k == 200 ? -7.f : 0.875f);
      q[size_t(k)] = f32_to_e4m3(1.f);
      q[size_t(256 + k)] = f32_to_e4m3(k % 2 == 0 ? 2.f : -2.f);
      q[size_t(512 + k)] = f32_to_e4m3(k == 0 ? 448.f : k == 200 ? 0.5f : 0.f);
    }
  }
  ops::LinearWeight weight() {
    return {Tensor(q.data(), DType::f8e4m3, {3, 256}), Tensor(s.data(), DType::f32, {1, 2})};
  }
};

TEST(OpsFp8, HandCheckedBlocksBothPaths) {
  const float want[2][3] = {{464.f, 1120.f, 50176.f}, {208.f, -31.5f, -7.f}};
  for (const ops::Fp8LinearPath path : {ops::Fp8LinearPath::w8a8, ops::Fp8LinearPath::weight_only}) {
    HandCase h;
    std::vector<bf16_t> out(6, f32_to_bf16(12345.f));
    ops::linear_fp8(Tensor(h.x.data(), DType::bf16, {2, 256}), h.weight(),
                    Tensor(out.data(), DType::bf16, {2, 3}), path);
    for (int m = 0; m < 2; ++m)
      for (int n = 0; n < 3; ++n)
        EXPECT_EQ(bf(out[size_t(m * 3 + n)]), want[m][n])
            << "path " << int(path) << " [" << m << ", " << n << "]";
  }
}

// linear_f32 (a tensor-parallel rank's partial) keeps path (a)'s acc unrounded: the hand case's sums.
TEST(OpsFp8, LinearF32KeepsTheW8A8SumUnrounded) {
  const float want[2][3] = {{464.75f, 1121.5f, 50175.5f}, {208.25f, -31.5f, -7.f}};
  HandCase h;
  std::vector<float> out(6, 12345.f);
  ops::linear_f32(Tensor(h.x.data(), DType::bf16, {2, 256}), h.weight(),
                  Tensor(out.data(), DType::f32, {2, 3}));
  for (int m = 0; m < 2; ++m)
    for (int n = 0; n < 3; ++n) EXPECT_EQ(out[size_t(m * 3 + n)], want[m][n]) << "[" << m << ", " << n << "]";
}

TEST(OpsFp8, LinearOpRunsW8A8ForAnFp8Weight) {
  // ops::linear with an FP8 LinearWeight is path (a): an activation whose quantization rounds tells it apart
  // from the weight-only path. x = [448, 1.0625, 0...]: q(1.0625) = 1 (a tie, to the even mantissa).
  std::vector<bf16_t> x(128, f32_to_bf16(0.f));
  x[0] = f32_to_bf16(448.f), x[1] = f32_to_bf16(1.0625f);
  std::vector<uint8_t> q(128, f32_to_e4m3(0.f));
  q[1] = f32_to_e4m3(1.f);
  std::vector<float> s = {1.f};
  const ops::LinearWeight w(Tensor(q.data(), DType::f8e4m3, {1, 128}), Tensor(s.data(), DType::f32, {1, 1}));
  std::vector<bf16_t> o(1), o_wo(1);
  ops::linear(Tensor(x.data(), DType::bf16, {1, 128}), w, Tensor(o.data(), DType::bf16, {1, 1}));
  ops::linear_fp8(Tensor(x.data(), DType::bf16, {1, 128}), w, Tensor(o_wo.data(), DType::bf16, {1, 1}),
                  ops::Fp8LinearPath::weight_only);
  EXPECT_EQ(bf(o[0]), 1.0f);
  EXPECT_EQ(bf(o_wo[0]), 1.0625f);
}

TEST(OpsFp8, E4m3EncodeEdgeCases) {
  EXPECT_EQ(f32_to_e4m3(448.f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(464.f), 0x7e);  // the tie above 448 saturates (480 does not exist)
  EXPECT_EQ(f32_to_e4m3(1e9f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-0.f), 0x80);
  EXPECT_EQ(f32_to_e4m3(0x1p-9f), 0x01);      // smallest subnormal
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);     // half of it: a tie, to the even zero
  EXPECT_EQ(f32_to_e4m3(0x1.8p-10f), 0x01);   // above the tie
  EXPECT_EQ(f32_to_e4m3(0x1.8p-9f), 0x02);    // 1.5 x 2^-9: tie between 1 and 2, to even 2
  EXPECT_EQ(f32_to_e4m3(7 * 0x1p-9f), 0x07);  // largest subnormal
  EXPECT_EQ(f32_to_e4m3(0x1p-6f), 0x08);      // smallest normal
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);      // tie between 1 and 1.125: even 1
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);      // tie between 1.125 and 1.25: even 1.25
  EXPECT_EQ(f32_to_e4m3(-1.1876f), 0xba);     // just above the tie
  for (int b = 0; b < 256; ++b) {             // decode then encode is the identity
    if ((b & 0x7f) == 0x7f) continue;         // NaN
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(uint8_t(b))), b) << b;
  }
}

TEST(OpsFp8, ActivationQuantizerScalesAndRounding) {
  // Group 0: amax 3 -> a_s = f32(3 / 448); q = e4m3(x / a_s) with a correctly rounded division. Group 1
  // (ragged, 72 wide): all zero -> a_s = 1e-10f / 448, q = 0. Group of row 1: a NaN is ignored by the max.
  const int64_t K = 200;
  std::vector<bf16_t> x(2 * K, f32_to_bf16(0.f));
  x[0] = f32_to_bf16(3.f), x[1] = f32_to_bf16(-1.f), x[2] = f32_to_bf16(0.01f);
  x[K + 5] = f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  x[K + 6] = f32_to_bf16(-448.f), x[K + 7] = f32_to_bf16(2.f);
  std::vector<uint8_t> q(2 * K, 0xff);
  std::vector<float> s(4, -1.f);
  ops::quantize_act_fp8(Tensor(x.data(), DType::bf16, {2, K}), Tensor(q.data(), DType::f8e4m3, {2, K}),
                        Tensor(s.data(), DType::f32, {2, 2}));
  const float s0 = 3.f / 448.f;
  EXPECT_EQ(s[0], s0);
  EXPECT_EQ(s[1], 1e-10f / 448.f);
  EXPECT_EQ(s[2], 1.f);
  EXPECT_EQ(q[0], 0x7e);  // 3 / f32(3/448) = 448.00003 -> 448
  EXPECT_EQ(q[1], f32_to_e4m3(-1.f / s0));
  EXPECT_EQ(q[2], f32_to_e4m3(bf(x[2]) / s0));
  for (int64_t k = 128; k < K; ++k) EXPECT_EQ(q[size_t(k)], 0) << k;
  EXPECT_EQ(q[size_t(K + 5)], 0x7f);
  EXPECT_EQ(q[size_t(K + 6)], 0xfe);
  EXPECT_EQ(q[size_t(K + 7)], f32_to_e4m3(2.f));
}

// The quantizer divides by the scale (a correctly rounded x / a_s), as vLLM's kernels do; a multiply by the
// reciprocal moves values that land on an e4m3 rounding boundary. Over groups of many scales and every bf16
// value of a range, the oracle equals the division everywhere and the reciprocal differs somewhere (so this
// test would catch a quantizer, CPU or GPU, that multiplies).
TEST(OpsFp8, ActivationQuantizerDividesNotMultipliesByTheReciprocal) {
  int differ = 0;
  for (int g = 0; g < 200; ++g) {
    std::vector<bf16_t> x(128);
    x[0] = f32_to_bf16(1.0f + float(g) * 0.37f);  // the group's amax
    for (int i = 1; i < 128; ++i)
      x[size_t(i)] = f32_to_bf16(bf(x[0]) * float(i) / 128.0f * (i % 2 ? 1.f : -1.f));
    std::vector<uint8_t> q(128);
    const float s = ops::cpu::quantize_act_group(x.data(), 128, q.data());
    EXPECT_EQ(s, bf(x[0]) / 448.0f);
    const float r = 1.0f / s;
    for (int i = 0; i < 128; ++i) {
      ASSERT_EQ(q[size_t(i)], f32_to_e4m3(bf(x[size_t(i)]) / s)) << g << ", " << i;
      differ += f32_to_e4m3(bf(x[size_t(i)]) * r) != q[size_t(i)];
    }
  }
  EXPECT_GT(differ, 0) << "no value told division from the reciprocal: the test cannot fail";
}

// Path (a) written out from docs/NUMERICS.md in the test itself, one rounding per written operation: the
// oracle equals it bitwise on ragged shapes. (Scaling in the other order, (p * a_s) * w_s as transformers'
// Triton kernel does, changes the fp32 sums in the last bit but, on this data, no bf16 output: only a
// tolerance can tell a GPU kernel's order apart.)
TEST(OpsFp8, W8A8IsTheWrittenContractBitwise) {
  const int64_t M = 5, N = 260, K = 333, Nb = ops::fp8_blocks(N), Kb = ops::fp8_blocks(K);
  std::vector<bf16_t> x = test_support::random_bf16(size_t(M * K), 21);
  std::vector<bf16_t> w = test_support::random_bf16(size_t(N * K), 22, -0.2f, 0.2f);
  std::vector<uint8_t> q(size_t(N * K)), qa(size_t(M * K));
  std::vector<float> s(size_t(Nb * Kb)), as(size_t(M * Kb));
  ops::quantize_weight_fp8(Tensor(w.data(), DType::bf16, {N, K}), Tensor(q.data(), DType::f8e4m3, {N, K}),
                           Tensor(s.data(), DType::f32, {Nb, Kb}), "w");
  ops::quantize_act_fp8(Tensor(x.data(), DType::bf16, {M, K}), Tensor(qa.data(), DType::f8e4m3, {M, K}),
                        Tensor(as.data(), DType::f32, {M, Kb}));
  std::vector<bf16_t> out(size_t(M * N));
  ops::linear_fp8(Tensor(x.data(), DType::bf16, {M, K}),
                  {Tensor(q.data(), DType::f8e4m3, {N, K}), Tensor(s.data(), DType::f32, {Nb, Kb})},
                  Tensor(out.data(), DType::bf16, {M, N}), ops::Fp8LinearPath::w8a8);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      volatile float acc = 0.0f;  // volatile: one rounding per written operation, no fma
      for (int64_t kb = 0; kb < Kb; ++kb) {
        volatile float l[8] = {};
        for (int64_t k = kb * 128; k < std::min(K, kb * 128 + 128); ++k) {
          volatile float prod = e4m3_to_f32(qa[size_t(m * K + k)]) * e4m3_to_f32(q[size_t(n * K + k)]);
          l[k % 8] = l[k % 8] + prod;
        }
        volatile float s0 = l[0] + l[4], s1 = l[1] + l[5], s2 = l[2] + l[6], s3 = l[3] + l[7];
        volatile float a = s0 + s2, b = s1 + s3;
        volatile float p = a + b;
        volatile float sc = as[size_t(m * Kb + kb)] * s[size_t((n / 128) * Kb + kb)];
        volatile float c = p * sc;
        acc = acc + c;
      }
      ASSERT_EQ(out[size_t(m * N + n)].bits, f32_to_bf16(acc).bits) << m << ", " << n;
    }
}

// Relative Frobenius error of out against an fp64 reference of the same quantized operands, for M x N x K.
double rel_error_vs_fp64(int64_t M, int64_t N, int64_t K, ops::Fp8LinearPath path, uint32_t seed) {
  const int64_t Nb = ops::fp8_blocks(N), Kb = ops::fp8_blocks(K);
  std::vector<bf16_t> x = test_support::random_bf16(size_t(M * K), seed);
  for (int64_t k = 0; k < K; ++k)
    x[size_t(k)] = f32_to_bf16(bf(x[size_t(k)]) * 64.f);  // groups of other scales
  std::vector<bf16_t> w = test_support::random_bf16(size_t(N * K), seed + 1, -0.1f, 0.1f);
  std::vector<uint8_t> q(size_t(N * K));
  std::vector<float> s(size_t(Nb * Kb));
  ops::quantize_weight_fp8(Tensor(w.data(), DType::bf16, {N, K}), Tensor(q.data(), DType::f8e4m3, {N, K}),
                           Tensor(s.data(), DType::f32, {Nb, Kb}), "w");
  std::vector<bf16_t> out(size_t(M * N));
  const ops::LinearWeight lw(Tensor(q.data(), DType::f8e4m3, {N, K}), Tensor(s.data(), DType::f32, {Nb, Kb}));
  ops::linear_fp8(Tensor(x.data(), DType::bf16, {M, K}), lw, Tensor(out.data(), DType::bf16, {M, N}), path);
  std::vector<uint8_t> qa(size_t(M * K));
  std::vector<float> as(size_t(M * Kb));
  ops::quantize_act_fp8(Tensor(x.data(), DType::bf16, {M, K}), Tensor(qa.data(), DType::f8e4m3, {M, K}),
                        Tensor(as.data(), DType::f32, {M, Kb}));
  double num = 0, den = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double ws = s[size_t((n / 128) * Kb + k / 128)];
        ref += path == ops::Fp8LinearPath::w8a8
                   ? double(e4m3_to_f32(qa[size_t(m * K + k)])) * as[size_t(m * Kb + k / 128)] *
                         e4m3_to_f32(q[size_t(n * K + k)]) * ws
                   : double(bf(x[size_t(m * K + k)])) * e4m3_to_f32(q[size_t(n * K + k)]) * ws;
      }
      const double d = double(bf(out[size_t(m * N + n)])) - ref;
      num += d * d, den += ref * ref;
    }
  return std::sqrt(num / den);
}

TEST(OpsFp8, RaggedShapesMatchFp64WithinTwoToMinusEight) {
  const int64_t shapes[][3] = {{3, 200, 300}, {1, 129, 129}, {5, 64, 50}, {2, 256, 384}, {7, 1, 1000}};
  for (const auto& sh : shapes)
    for (const ops::Fp8LinearPath path : {ops::Fp8LinearPath::w8a8, ops::Fp8LinearPath::weight_only}) {
      const double e = rel_error_vs_fp64(sh[0], sh[1], sh[2], path, uint32_t(sh[1] + sh[2]));
      EXPECT_LE(e, std::ldexp(1.0, -8)) << sh[0] << "x" << sh[1] << "x" << sh[2] << " path " << int(path);
      EXPECT_GT(e, 0.0);  // the bf16 output rounding is there: the comparison can fail
    }
}

TEST(OpsFp8, RowResultDoesNotDependOnTheBatch) {
  const int64_t M = 4, N = 130, K = 260, Nb = ops::fp8_blocks(N), Kb = ops::fp8_blocks(K);
  std::vector<bf16_t> x = test_support::random_bf16(size_t(M * K), 7);
  std::vector<uint8_t> q(size_t(N * K));
  for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t((i * 37) % 0x7e);
  std::vector<float> s(size_t(Nb * Kb), 0.01f);
  const ops::LinearWeight lw(Tensor(q.data(), DType::f8e4m3, {N, K}), Tensor(s.data(), DType::f32, {Nb, Kb}));
  std::vector<bf16_t> all(static_cast<size_t>(M * N)), one(static_cast<size_t>(N));
  ops::linear(Tensor(x.data(), DType::bf16, {M, K}), lw, Tensor(all.data(), DType::bf16, {M, N}));
  ops::linear(Tensor(x.data() + 2 * K, DType::bf16, {1, K}), lw, Tensor(one.data(), DType::bf16, {1, N}));
  for (int64_t n = 0; n < N; ++n) EXPECT_EQ(all[size_t(2 * N + n)].bits, one[size_t(n)].bits) << n;
}

TEST(OpsFp8, OnlineQuantizationRoundTripBound) {
  // Blocks of very different magnitudes (1e-3 .. 30), a ragged [200, 300] weight, and an all-zero block.
  const int64_t N = 200, K = 300, Nb = 2, Kb = 3;
  std::vector<bf16_t> w = test_support::random_bf16(size_t(N * K), 11, -1.f, 1.f);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < K; ++c) {
      const float mag = std::pow(10.f, float((r / 128) * 3 + c / 128) - 3.f);
      w[size_t(r * K + c)] = f32_to_bf16(r >= 128 && c >= 256 ? 0.f : bf(w[size_t(r * K + c)]) * mag);
    }
  std::vector<uint8_t> q(size_t(N * K));
  std::vector<float> s(size_t(Nb * Kb));
  ops::quantize_weight_fp8(Tensor(w.data(), DType::bf16, {N, K}), Tensor(q.data(), DType::f8e4m3, {N, K}),
                           Tensor(s.data(), DType::f32, {Nb, Kb}), "w");
  EXPECT_EQ(s[size_t(1 * Kb + 2)], 1e-4f / 448.f);  // the all-zero block: DeepGEMM's clamp
  for (int64_t b = 0; b < Nb * Kb; ++b) {
    float amax = 0;
    for (int64_t r = (b / Kb) * 128; r < std::min<int64_t>(N, (b / Kb) * 128 + 128); ++r)
      for (int64_t c = (b % Kb) * 128; c < std::min<int64_t>(K, (b % Kb) * 128 + 128); ++c)
        amax = std::max(amax, std::fabs(bf(w[size_t(r * K + c)])));
    if (amax > 0) {
      EXPECT_EQ(s[size_t(b)], std::max(amax, 1e-4f) / 448.f) << b;
    }
  }
  int saturated = 0;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < K; ++c) {
      const float sc = s[size_t((r / 128) * Kb + c / 128)], v = bf(w[size_t(r * K + c)]);
      const float back = e4m3_to_f32(q[size_t(r * K + c)]) * sc;
      EXPECT_LE(std::fabs(back - v),
                (std::ldexp(1.f, -4) * std::fabs(v) + std::ldexp(1.f, -10) * sc) * 1.0001f)
          << r << ", " << c;
      saturated += (q[size_t(r * K + c)] & 0x7f) == 0x7e;
    }
  EXPECT_GE(saturated, 5);  // each non-zero block's amax lands on +-448
}

TEST(OpsFp8, QuantizerRefusesNonFiniteWeightsNamingThem) {
  std::vector<bf16_t> w(4, f32_to_bf16(1.f));
  w[3] = f32_to_bf16(std::numeric_limits<float>::infinity());
  std::vector<uint8_t> q(4);
  std::vector<float> s(1);
  expect_contains(error_of([&] {
                    ops::quantize_weight_fp8(
                        Tensor(w.data(), DType::bf16, {2, 2}), Tensor(q.data(), DType::f8e4m3, {2, 2}),
                        Tensor(s.data(), DType::f32, {1, 1}), "model.layers.0.mlp.up_proj.weight");
                  }),
                  {"model.layers.0.mlp.up_proj.weight", "non-finite", "[1, 1]"});
}

TEST(OpsFp8, DequantizeIsOneRoundedProduct) {
  std::vector<uint8_t> q = {f32_to_e4m3(1.5f), f32_to_e4m3(-3.f), f32_to_e4m3(0.f), f32_to_e4m3(448.f)};
  std::vector<float> s = {1.f / 3.f};
  std::vector<bf16_t> out(4);
  ops::dequantize_fp8({Tensor(q.data(), DType::f8e4m3, {2, 2}), Tensor(s.data(), DType::f32, {1, 1})},
                      Tensor(out.data(), DType::bf16, {2, 2}));
  EXPECT_EQ(out[0].bits, f32_to_bf16(1.5f * (1.f / 3.f)).bits);
  EXPECT_EQ(out[1].bits, f32_to_bf16(-1.f).bits);
  EXPECT_EQ(out[2].bits, f32_to_bf16(0.f).bits);
  EXPECT_EQ(out[3].bits, f32_to_bf16(448.f * (1.f / 3.f)).bits);
}

TEST(OpsFp8, ArgumentChecksNameTheProblem) {
  HandCase h;
  std::vector<bf16_t> out(6);
  std::vector<float> bad_s = {1.f, 1.f, 1.f};
  const Tensor x(h.x.data(), DType::bf16, {2, 256});
  expect_contains(error_of([&] {
                    ops::linear(x,
                                ops::LinearWeight(Tensor(h.q.data(), DType::f8e4m3, {3, 256}),
                                                  Tensor(bad_s.data(), DType::f32, {1, 3})),
                                Tensor(out.data(), DType::bf16, {2, 3}));
                  }),
                  {"block scales", "f32[1, 2]"});
  expect_contains(error_of([&] {
                    ops::linear(x, ops::LinearWeight(Tensor(h.q.data(), DType::f8e4m3, {3, 256})),
                                Tensor(out.data(), DType::bf16, {2, 3}));
                  }),
                  {"no block scales"});
  expect_contains(error_of([&] {
                    ops::linear(x, h.weight(), Tensor(out.data(), DType::bf16, {2, 2}));
                  }),
                  {"out", "[2, 3]"});
}

// Path (d), the CUDA e4m3 x 16 GEMV's oracle: the hand case (every chunk sum and scaled add exact, so every
// thread count gives the hand-checked values), fp64 within 2^-8 on ragged N, the NaN codes' +-480, the
// order (a case where the butterfly's association shows in the result) and the argument checks.
TEST(OpsFp8, Chunk16HandCheckedBlocks) {
  const float want[2][3] = {{464.f, 1120.f, 50176.f}, {208.f, -31.5f, -7.f}};
  for (const int threads : {32, 64, 128, 512}) {
    HandCase h;
    std::vector<bf16_t> out(6, f32_to_bf16(12345.f));
    ops::linear_fp8_chunk16(Tensor(h.x.data(), DType::bf16, {2, 256}), h.weight(),
                            Tensor(out.data(), DType::bf16, {2, 3}), threads);
    for (int m = 0; m < 2; ++m)
      for (int n = 0; n < 3; ++n)
        EXPECT_EQ(bf(out[size_t(m * 3 + n)]), want[m][n]) << threads << " threads [" << m << ", " << n << "]";
  }
}

TEST(OpsFp8, Chunk16MatchesFp64WithinTwoToMinusEight) {
  const int64_t shapes[][3] = {{3, 200, 304}, {1, 129, 128}, {5, 64, 48}, {8, 37, 1008}};
  for (const auto& sh : shapes) {
    const int64_t M = sh[0], N = sh[1], K = sh[2], Nb = ops::fp8_blocks(N), Kb = ops::fp8_blocks(K);
    std::vector<bf16_t> x = test_support::random_bf16(size_t(M * K), uint32_t(N + K));
    std::vector<bf16_t> w = test_support::random_bf16(size_t(N * K), uint32_t(N + K + 1), -0.1f, 0.1f);
    std::vector<uint8_t> q(size_t(N * K));
    std::vector<float> s(size_t(Nb * Kb));
    ops::quantize_weight_fp8(Tensor(w.data(), DType::bf16, {N, K}), Tensor(q.data(), DType::f8e4m3, {N, K}),
                             Tensor(s.data(), DType::f32, {Nb, Kb}), "w");
    const ops::LinearWeight lw(Tensor(q.data(), DType::f8e4m3, {N, K}),
                               Tensor(s.data(), DType::f32, {Nb, Kb}));
    for (const int threads : {64, 256}) {
      std::vector<bf16_t> out(size_t(M * N));
      ops::linear_fp8_chunk16(Tensor(x.data(), DType::bf16, {M, K}), lw,
                              Tensor(out.data(), DType::bf16, {M, N}), threads);
      double num = 0, den = 0;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double ref = 0;
          for (int64_t k = 0; k < K; ++k)
            ref += double(bf(x[size_t(m * K + k)])) * e4m3_to_f32(q[size_t(n * K + k)]) *
                   s[size_t((n / 128) * Kb + k / 128)];
          const double d = double(bf(out[size_t(m * N + n)])) - ref;
          num += d * d, den += ref * ref;
        }
      const double e = std::sqrt(num / den);
      EXPECT_LE(e, std::ldexp(1.0, -8)) << M << "x" << N << "x" << K << " threads " << threads;
      EXPECT_GT(e, 0.0);  // the bf16 output rounding is there: the comparison can fail
    }
  }
}

TEST(OpsFp8, Chunk16NanCodesReadAs480AndTheOrderIsTheKernels) {
  // K = 32 * 16 * 2 = 1024 at 32 threads: thread t owns chunks t and t + 32. x = 1 everywhere.
  const int64_t K = 1024;
  std::vector<bf16_t> x(size_t(K), f32_to_bf16(1.f));
  std::vector<uint8_t> q(size_t(2 * K), 0);
  std::vector<float> s(8, 1.f);
  q[0] = 0x7f;               // row 0: +480 (NaN code) at k = 0
  q[size_t(K + 16)] = 0xff;  // row 1: -480 at chunk 1
  const ops::LinearWeight lw(Tensor(q.data(), DType::f8e4m3, {2, K}), Tensor(s.data(), DType::f32, {1, 8}));
  std::vector<float> out(2);
  ops::linear_fp8_chunk16(Tensor(x.data(), DType::bf16, {1, K}), lw, Tensor(out.data(), DType::f32, {1, 2}),
                          32);
  EXPECT_EQ(out[0], 480.f);
  EXPECT_EQ(out[1], -480.f);
  // The butterfly's association: lane 0 holds 2^24, lanes 1 and 17 hold 1. Added in lane order, each 1 is
  // lost to 2^24 (2^24 + 1 ties to even); the butterfly meets lanes 1 and 17 first (off 16: 1 + 1 = 2), then
  // lanes 0 and 1 (off 1): 2^24 + 2, exact.
  std::vector<uint8_t> q2(size_t(K), 0);
  std::vector<bf16_t> x2(size_t(K), f32_to_bf16(0.f));
  x2[0] = f32_to_bf16(131072.f);  // chunk 0 (thread 0): 2^17 * 128 = 2^24
  q2[0] = f32_to_e4m3(128.f);
  for (const int c : {1, 17}) {  // chunks 1 and 17 (threads 1 and 17): 1 each
    x2[size_t(16 * c)] = f32_to_bf16(1.f);
    q2[size_t(16 * c)] = f32_to_e4m3(1.f);
  }
  const ops::LinearWeight lw2(Tensor(q2.data(), DType::f8e4m3, {1, K}), Tensor(s.data(), DType::f32, {1, 8}));
  ops::linear_fp8_chunk16(Tensor(x2.data(), DType::bf16, {1, K}), lw2, Tensor(out.data(), DType::f32, {1, 1}),
                          32);
  EXPECT_EQ(out[0], 16777218.f);
}

TEST(OpsFp8, Chunk16ArgumentChecks) {
  HandCase h;
  std::vector<bf16_t> out(6);
  const Tensor x(h.x.data(), DType::bf16, {2, 256});
  expect_contains(error_of([&] {
                    ops::linear_fp8_chunk16(x, h.weight(), Tensor(out.data(), DType::bf16, {2, 3}), 48);
                  }),
                  {"linear_fp8_chunk16", "multiple of 32"});
  std::vector<uint8_t> q(3 * 200);
  std::vector<float> s(2, 1.f);
  const ops::LinearWeight w200(Tensor(q.data(), DType::f8e4m3, {3, 200}),
                               Tensor(s.data(), DType::f32, {1, 2}));
  expect_contains(error_of([&] {
                    ops::linear_fp8_chunk16(Tensor(h.x.data(), DType::bf16, {2, 200}), w200,
                                            Tensor(out.data(), DType::bf16, {2, 3}), 32);
                  }),
                  {"multiple of 16"});
}

}  // namespace
