// Helpers shared by the Qwen3-VL GPU tests (test_cuda_vision.cpp, test_cuda_vision_varlen.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "kiln/tensor.h"
#include "test_util_cuda.h"

namespace kiln::test {

// A device tensor over b's bytes.
inline Tensor dev_t(const Buffer& b, std::initializer_list<int64_t> dims, DType t = DType::bf16) {
  return Tensor(b.data(), t, dims, Device::cuda());
}

}  // namespace kiln::test
