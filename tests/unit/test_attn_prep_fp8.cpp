// FP8 E4M3 / UE8M0 conversions (src/ops/fp8.h): hand-checked rounding edges and exhaustive round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/fp8.h"

namespace {

using kiln::e4m3_block_exponent;
using kiln::e4m3_to_f32;
using kiln::f32_to_e4m3;

TEST(Fp8E4m3, HandCheckedValues) {
  EXPECT_EQ(f32_to_e4m3(0.f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.f), 0x80);
  EXPECT_EQ(f32_to_e4m3(1.f), 0x38);    // exp 7, man 0
  EXPECT_EQ(f32_to_e4m3(-2.f), 0xc0);   // sign, exp 8
  EXPECT_EQ(f32_to_e4m3(448.f), 0x7e);  // max finite
  EXPECT_EQ(f32_to_e4m3(-448.f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(240.f), 0x77);         // 1.875 * 2^7
  EXPECT_EQ(f32_to_e4m3(0.015625f), 0x08);     // 2^-6: smallest normal
  EXPECT_EQ(f32_to_e4m3(0.001953125f), 0x01);  // 2^-9: smallest subnormal
  EXPECT_EQ(f32_to_e4m3(0.013671875f), 0x07);  // 7 * 2^-9: largest subnormal
}

TEST(Fp8E4m3, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);        // tie between 1 (even) and 1.125 -> 1
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);        // tie between 1.125 and 1.25 (even) -> 1.25
  EXPECT_EQ(f32_to_e4m3(1.07f), 0x39);          // above the tie -> 1.125
  EXPECT_EQ(f32_to_e4m3(0.0009765625f), 0x00);  // 2^-10: tie between 0 (even) and 2^-9 -> 0
  EXPECT_EQ(f32_to_e4m3(0.00098f), 0x01);       // just above 2^-10 -> 2^-9
  EXPECT_EQ(f32_to_e4m3(0.0029296875f), 0x02);  // 1.5 * 2^-9: tie between 1 and 2 (even) -> 2
  EXPECT_EQ(f32_to_e4m3(0.0048828125f), 0x02);  // 2.5 * 2^-9: tie between 2 (even) and 3 -> 2
  EXPECT_EQ(f32_to_e4m3(0.0146484375f), 0x08);  // 7.5 * 2^-9: tie between 7 and 8 (even) -> smallest normal
  EXPECT_EQ(f32_to_e4m3(1e-30f), 0x00);         // deep underflow
  EXPECT_EQ(f32_to_e4m3(-1e-45f), 0x80);        // f32 subnormal, sign kept
}

TEST(Fp8E4m3, SaturatesAndHandlesNonFinite) {
  EXPECT_EQ(f32_to_e4m3(449.f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(464.f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0x7f);  // sign dropped by contract
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
}

TEST(Fp8E4m3, ExhaustiveRoundTripAndMidpoints) {
  // Every non-NaN byte decodes and re-encodes to itself; the midpoint between two neighbours rounds to the
  // one with the even mantissa, and anything strictly inside goes to the nearer.
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    const float v = e4m3_to_f32(uint8_t(b));
    EXPECT_EQ(f32_to_e4m3(v), b) << "byte " << b << " value " << v;
  }
  for (int b = 0; b < 0x7e; ++b) {
    const float lo = e4m3_to_f32(uint8_t(b)), hi = e4m3_to_f32(uint8_t(b + 1));
    const float mid = (lo + hi) / 2;  // exact in f32
    const int even = (b % 2 == 0) ? b : b + 1;
    EXPECT_EQ(f32_to_e4m3(mid), even) << "midpoint of " << b;
    EXPECT_EQ(f32_to_e4m3(-mid), even | 0x80);
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.f)), b);
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 1000.f)), b + 1);
  }
}

TEST(Fp8Ue8m0, BlockExponent) {
  // e = smallest integer with a <= 448 * 2^e.
  EXPECT_EQ(e4m3_block_exponent(0.f), 0);
  EXPECT_EQ(e4m3_block_exponent(448.f), 0);
  EXPECT_EQ(e4m3_block_exponent(448.00003f), 1);  // just above 448
  EXPECT_EQ(e4m3_block_exponent(450.f), 1);
  EXPECT_EQ(e4m3_block_exponent(896.f), 1);
  EXPECT_EQ(e4m3_block_exponent(224.f), -1);
  EXPECT_EQ(e4m3_block_exponent(225.f), 0);
  EXPECT_EQ(e4m3_block_exponent(1.f), -8);  // 1 <= 448 / 256 = 1.75; 1 > 448 / 512
  EXPECT_EQ(e4m3_block_exponent(1.75f), -8);
  EXPECT_EQ(e4m3_block_exponent(1.76f), -7);
  EXPECT_EQ(e4m3_block_exponent(3e38f), 120);                   // 3e38 <= 1.75 * 2^128
  EXPECT_EQ(e4m3_block_exponent(std::ldexp(1.f, -130)), -127);  // -138 clamped
  EXPECT_EQ(e4m3_block_exponent(1e-45f), -127);                 // smallest f32 subnormal, clamped
  EXPECT_EQ(kiln::ue8m0_from_exponent(0), 127);
  EXPECT_EQ(kiln::ue8m0_from_exponent(-127), 0);
  EXPECT_EQ(kiln::ue8m0_to_f32(127), 1.f);
  EXPECT_EQ(kiln::ue8m0_to_f32(128), 2.f);
  EXPECT_EQ(kiln::ue8m0_to_f32(0), std::ldexp(1.f, -127));
  EXPECT_TRUE(std::isnan(kiln::ue8m0_to_f32(255)));
  for (int e = -127; e <= 127; ++e) EXPECT_EQ(kiln::exp2_neg(e), std::ldexp(1.f, -e)) << e;
  // Brute force against the definition on a sweep of values.
  for (float a = 1e-3f; a < 1e6f; a *= 1.0137f) {
    const int e = e4m3_block_exponent(a);
    EXPECT_LE(double(a), 448.0 * std::ldexp(1.0, e)) << a;
    EXPECT_GT(double(a), 448.0 * std::ldexp(1.0, e - 1)) << a;
  }
}

}  // namespace
