// FP8 E4M3 (OCP "e4m3fn": bias 7, no infinities, max 448, NaN = S.1111.111) and UE8M0 scale bytes
// (value 2^(byte - 127), byte 255 = NaN, never produced here). Host and device, integer arithmetic only,
// so the CPU oracle, the unfused kernels and the fused kernels agree bit for bit.
//
// Block quantisation (one UE8M0 byte per 64 contiguous elements; the KV-cache contract):
//   a = max |v| over the block's finite values (NaN and +-Inf are ignored; a block of only zeros or
//       non-finite values has a = 0);
//   e = the smallest integer with a <= 448 * 2^e (exactly ceil(log2(a / 448)) computed without rounding),
//       clamped to [-127, 127]; a == 0 gives e = 0 (scale 1);
//   scale byte = e + 127;  q = e4m3_rn_sat(v * 2^-e)  (the product is exact: a power-of-two scaling).
// e4m3_rn_sat: round to nearest even; finite values beyond 448 saturate to +-448 (0x7e / 0xfe), +-Inf
// saturates to +-448, NaN becomes 0x7f whatever its sign (CPU and GPU arithmetic give NaNs of different
// signs and payloads; dropping them keeps the bitwise contract); -0 stays 0x80.
// Values below half the smallest subnormal (2^-10) become signed zero; a tie at 2^-10 goes to zero (even).
#pragma once

#include <cstdint>

#include "kiln/dtype.h"

namespace kiln {

KILN_HD float e4m3_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t man = b & 0x7u;
  if (exp == 0xfu && man == 0x7u) return f32_from_bits(sign | 0x7fc00000u);  // NaN
  if (exp == 0) {
    const float v = float(man) * (1.0f / 512.0f);  // subnormal: man * 2^-9, exact
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 120u) << 23) | (man << 20));  // rebias 7 -> 127
}

KILN_HD uint8_t f32_to_e4m3(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fu;                   // NaN (sign dropped)
  if (a >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // >= 448 (incl. Inf): saturate to 448
  if (a < 0x3c800000u) {
    // Below 2^-6 (smallest normal): subnormal grid of 2^-9. q = a / 2^-9 rounded to nearest even.
    if (a < 0x3a800000u) return sign;  // < 2^-10 (2^-10 itself is a tie and rounds to 0 below)
    const uint32_t e = a >> 23;        // biased f32 exponent, 117..120
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t sh = 141u - e;  // a / 2^-9 = m * 2^(e - 141): shift right by 21..24
    uint32_t q = m >> sh;
    const uint32_t rem = m & ((1u << sh) - 1u);
    const uint32_t half = 1u << (sh - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return uint8_t(sign | q);  // q == 8 is the smallest normal (0x08): the encoding carries over
  }
  // Normal: keep 3 mantissa bits, round to nearest even, rebias 127 -> 7.
  uint32_t v = a - (120u << 23);
  v += 0x7ffffu + ((v >> 20) & 1u);
  uint32_t q = v >> 20;
  if (q > 0x7eu) q = 0x7eu;  // rounding up past 448 (values in (448, 464)) saturates
  return uint8_t(sign | q);
}

// Smallest e with a <= 448 * 2^e, clamped to [-127, 127]; a must be finite and >= 0; a == 0 -> 0.
KILN_HD int e4m3_block_exponent(float a) {
  const uint32_t u = f32_bits(a);
  if (u == 0) return 0;
  int k;          // a = m * 2^k, m in [1, 2)
  uint32_t mant;  // m's 23 fraction bits
  const uint32_t be = u >> 23;
  if (be == 0) {  // f32 subnormal: normalise
    uint32_t m = u & 0x7fffffu;
    k = -126;
    while (!(m & 0x800000u)) {
      m <<= 1;
      --k;
    }
    mant = m & 0x7fffffu;
  } else {
    k = int(be) - 127;
    mant = u & 0x7fffffu;
  }
  // 448 = 1.75 * 2^8: a <= 1.75 * 2^(8+e)  <=>  e >= k - 8 when m <= 1.75, else e >= k - 7.
  int e = mant <= 0x600000u ? k - 8 : k - 7;
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  return e;
}

KILN_HD uint8_t ue8m0_from_exponent(int e) {
  return uint8_t(e + 127);
}
KILN_HD float ue8m0_to_f32(uint8_t b) {
  if (b == 255) return f32_from_bits(0x7fc00000u);
  if (b == 0) return f32_from_bits(0x00400000u);  // 2^-127 (f32 subnormal)
  return f32_from_bits(uint32_t(b) << 23);
}
// 2^-e as an f32 (exact for e in [-127, 127]; 2^127 is the largest).
KILN_HD float exp2_neg(int e) {
  const int b = 127 - e;                                  // biased exponent of 2^-e
  if (b <= 0) return f32_from_bits(0x00400000u >> (-b));  // only b == 0 occurs (e == 127): 2^-127
  return f32_from_bits(uint32_t(b) << 23);
}

}  // namespace kiln
