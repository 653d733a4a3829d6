// Helpers for the GPU tests: device buffers from host vectors, deterministic random bf16 data, ulp
// distance (the whole-model tests add common/model_steps.h). Every test skips (and says so) when no GPU is
// visible.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/test_support.h"
#include "kiln/cuda_check.h"
#include "kiln/dtype.h"
#include "kiln/tensor.h"

#define KILN_REQUIRE_GPU()                                                       \
  do {                                                                           \
    if (!kiln::cuda_available()) GTEST_SKIP() << "no CUDA GPU visible: skipped"; \
  } while (0)

namespace kiln::test {

// ||a - b|| / ||b|| over bf16 vectors of one size (Frobenius; b is the reference).
inline double rel_frob(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

template <typename T>
Buffer to_device(const std::vector<T>& v) {
  Buffer b(v.size() * sizeof(T), Device::cuda());
  copy_bytes(b.data(), Device::cuda(), v.data(), Device::cpu(), v.size() * sizeof(T));
  return b;
}

template <typename T>
std::vector<T> to_host(const Buffer& b, size_t n) {
  std::vector<T> v(n);
  copy_bytes(v.data(), Device::cpu(), b.data(), Device::cuda(), n * sizeof(T));
  return v;
}

// Sets every byte of a device buffer to 0xff (bf16 and f32 NaN), so an element a kernel never writes fails
// any value check. Ordered before later work on the legacy default stream, like any cudaMemset.
inline void poison(const Buffer& b) {
  KILN_CUDA_CHECK(cudaMemset(b.data(), 0xff, b.bytes()));
}

inline std::vector<bf16_t> random_bf16(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return test_support::random_bf16(n, seed, lo, hi);  // the GPU tests' default range
}

// Distance in bf16 ulps between two finite bf16 values (via the order-preserving integer map).
inline int bf16_ulps(bf16_t a, bf16_t b) {
  auto key = [](uint16_t u) { return (u & 0x8000u) ? -int(u & 0x7fffu) : int(u); };
  return std::abs(key(a.bits) - key(b.bits));
}

}  // namespace kiln::test
