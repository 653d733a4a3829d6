// The oracle of the prompt-logprob tests (CPU and GPU): one prefill of a whole prompt, in order, with the
// logits of every row. f32 [n, vocab] on the host.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/tensor.h"
#include "model/qwen3.h"

namespace kiln::test {

inline std::vector<float> every_row_logits(Qwen3Model& m, const std::vector<int32_t>& prompt, int ps) {
  const int64_t V = m.config().vocab_size, n = int64_t(prompt.size());
  const int pages = int(n + ps - 1) / ps + 1;
  KvCache cache(m.config(), pages, ps, ops::KvLayout::nhd, DType::bf16, m.device());
  BatchDesc b;
  b.page_size = ps;
  for (int32_t p = 0; p < n; ++p) {
    b.tokens.push_back(prompt[size_t(p)]);
    b.positions.push_back(p);
    b.slot_mapping.push_back(p);  // pages in order: slot == position
    b.logit_rows.push_back(p);
  }
  b.cu_q = {0, int32_t(n)};
  b.kv_lens = {int32_t(n)};
  b.pages_stride = pages;
  for (int i = 0; i < pages; ++i) b.page_table.push_back(i);
  std::vector<float> out(size_t(n * V));
  Buffer dev(out.size() * sizeof(float), m.device());
  m.forward(b, cache, Tensor(dev.data(), DType::f32, {n, V}, m.device()));
  copy_bytes(out.data(), Device::cpu(), dev.data(), m.device(), out.size() * sizeof(float));
  return out;
}

}  // namespace kiln::test
