// A random block-FP8 weight for the GPU tests: e4m3 [N, K] (row stride ld) with f32 block scales, its path
// (c) dequantization (ops::dequantize_fp8, the CPU oracle) in bf16 with the same row stride, and both on the
// device as GEMV weights (ops/cuda/gemv.h: GemvWeight).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kiln/tensor.h"
#include "ops/cuda/gemv.h"
#include "ops/fp8_linear.h"
#include "test_util_cuda.h"

namespace kiln::test {

// A test weight's shape: its name in failure messages, N x K and the row stride (0: K).
struct WeightShape {
  const char* name;
  int64_t n, k, ld;
};

struct Fp8TestWeight {
  int64_t n, k, ld;
  std::vector<uint8_t> q;   // [n, ld], padding zero
  std::vector<float> s;     // [ceil(n/128), ceil(k/128)]
  std::vector<bf16_t> deq;  // [n, ld] bf16(f32(q) * s), padding zero
  Buffer dq, ds, ddeq;

  // Every finite e4m3 code (NaN codes 0x7f / 0xff are replaced by 0x7e / 0xfe), scales 2^-12 .. 2^-7 with
  // varied mantissas, so |w| reaches ~3.5 and spans the subnormals.
  Fp8TestWeight(int64_t n_, int64_t k_, uint32_t seed, int64_t ld_ = 0)
      : n(n_),
        k(k_),
        ld(ld_ ? ld_ : k_),
        q(size_t(n_ * ld)),
        s(size_t(ops::fp8_blocks(n_) * ops::fp8_blocks(k_))) {
    std::mt19937 rng(seed);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        uint8_t b = uint8_t(rng() & 0xffu);
        if ((b & 0x7fu) == 0x7fu) b ^= 1u;
        q[size_t(r * ld + c)] = b;
      }
    for (size_t i = 0; i < s.size(); ++i)
      s[i] = std::ldexp(1.0f + float(rng() % 128) / 128.0f, -12 + int(rng() % 6));
    std::vector<bf16_t> dense(size_t(n * k));
    ops::dequantize_fp8({Tensor::strided(q.data(), DType::f8e4m3, {n, k}, {ld, 1}),
                         Tensor(s.data(), DType::f32, {ops::fp8_blocks(n), ops::fp8_blocks(k)})},
                        Tensor(dense.data(), DType::bf16, {n, k}));
    deq.assign(size_t(n * ld), bf16_t{});
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) deq[size_t(r * ld + c)] = dense[size_t(r * k + c)];
    dq = to_device(q);
    ds = to_device(s);
    ddeq = to_device(deq);
  }
  cuda::GemvWeight fp8() const { return {dq.data(), ld, static_cast<const float*>(ds.data())}; }
  cuda::GemvWeight bf16() const { return {ddeq.data(), ld, nullptr}; }
  // The device weight as an ops::LinearWeight (FP8) and its dequantization (bf16).
  ops::LinearWeight fp8_linear() const {
    return {Tensor::strided(dq.data(), DType::f8e4m3, {n, k}, {ld, 1}, Device::cuda()),
            Tensor(ds.data(), DType::f32, {ops::fp8_blocks(n), ops::fp8_blocks(k)}, Device::cuda())};
  }
  ops::LinearWeight bf16_linear() const {
    return {Tensor::strided(ddeq.data(), DType::bf16, {n, k}, {ld, 1}, Device::cuda())};
  }
};

}  // namespace kiln::test
