// Helpers of the whole-model decode tests on the GPU (test_cuda_graph.cpp, test_cuda_model_fp8.cpp): one
// sequence's decode step at a position, and a device tensor's floats on the host.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/batch.h"
#include "kiln/tensor.h"

namespace kiln::test {

// The one-token step of a sequence at position pos, its pages in reverse order (page of position p is
// 15 - p / ps) so a page-table change shows.
inline BatchDesc step_batch(int32_t pos, int32_t token, int32_t ps) {
  BatchDesc b;
  b.page_size = ps;
  b.tokens = {token};
  b.positions = {pos};
  b.slot_mapping = {int64_t(15 - pos / ps) * ps + pos % ps};
  b.cu_q = {0, 1};
  b.kv_lens = {pos + 1};
  b.pages_stride = pos / ps + 1;
  for (int32_t i = 0; i <= pos / ps; ++i) b.page_table.push_back(15 - i);
  b.logit_rows = {0};
  return b;
}

// An f32 device tensor's values.
inline std::vector<float> host_floats(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  copy_bytes(v.data(), Device::cpu(), t.data, t.device, v.size() * 4);
  return v;
}

}  // namespace kiln::test
