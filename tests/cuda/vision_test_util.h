// Helpers shared by the Qwen3-VL GPU tests (test_cuda_vision.cpp, test_cuda_vision_varlen.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "kiln/tensor.h"

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

// A device tensor over b's bytes.
inline Tensor dev_t(const Buffer& b, std::initializer_list<int64_t> dims, DType t = DType::bf16) {
  return Tensor(b.data(), t, dims, Device::cuda());
}

}  // namespace kiln::test
