// Element types and exact scalar conversions, usable on host and device.
// bf16/fp16 conversions round to nearest even (NaN stays NaN); they are bit-exact with CUDA's
// __float2bfloat16_rn / __float2half_rn so the CPU oracle and the kernels agree bit for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__ __forceinline__
#else
#define KILN_HD inline
#endif

namespace kiln {

enum class DType : uint8_t { f32, f16, bf16, f8e4m3, u8, i8, i16, i32, i64, u16, u32, u64, f64, bool_ };

constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64:
    case DType::u64:
      return 8;
    case DType::f32:
    case DType::i32:
    case DType::u32:
      return 4;
    case DType::f16:
    case DType::bf16:
    case DType::i16:
    case DType::u16:
      return 2;
    case DType::f8e4m3:
    case DType::u8:
    case DType::i8:
    case DType::bool_:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t);  // "bf16", "f32", ...

// Raw 16-bit storage types: plain structs so host code needs no CUDA headers.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

KILN_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
KILN_HD float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

KILN_HD float bf16_to_f32(bf16_t h) {
  return f32_from_bits(uint32_t(h.bits) << 16);
}

KILN_HD bf16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                                  // round to nearest even
  return bf16_t{uint16_t(u >> 16)};
}

KILN_HD float f16_to_f32(f16_t h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t man = h.bits & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return f32_from_bits(sign);
    // subnormal: man * 2^-24, exact in f32
    float v = float(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (man << 13));
  return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

KILN_HD f16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16_t{uint16_t(sign | 0x7e00u)};   // NaN
  if (a >= 0x477ff000u) return f16_t{uint16_t(sign | 0x7c00u)};  // rounds to >= 65520: Inf
  if (a < 0x38800000u) {
    // f16 subnormal or zero: value / 2^-24, rounded to nearest even (exact f32 arithmetic below 2^24).
    if (a < 0x33000000u) return f16_t{sign};  // < 2^-25: rounds to 0 (tie at 2^-25 goes to even 0)
    const uint32_t e = a >> 23;               // biased exponent, 102..112
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // m * 2^(e-150) / 2^-24 = m >> (126 - e)
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return f16_t{uint16_t(sign | q)};
  }
  uint32_t v = a - 0x38000000u;  // rebias 127 -> 15
  v += 0xfffu + ((v >> 13) & 1u);
  return f16_t{uint16_t(sign | (v >> 13))};
}

}  // namespace kiln
