#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/reference.h"

namespace kiln::ops::cpu {

void argmax_rows(const Tensor& logits, const Tensor& offsets, const Tensor& out) {
  const int64_t R = logits.shape[0], V = logits.shape[1];
  const int64_t* off = offsets.data ? offsets.ptr<int64_t>() : nullptr;
  for (int64_t r = 0; r < R; ++r) {
    const float* x = logits.ptr<float>() + r * logits.stride[0];
    int64_t best = 0;
    float v = x[0] == x[0] ? x[0] : -__builtin_inff();  // NaN ranks below every number
    for (int64_t i = 1; i < V; ++i)
      if (x[i] > v) v = x[i], best = i;  // strictly greater: the lowest index among equal maxima
    out.ptr<int32_t>()[r] = int32_t(best + (off ? off[best] : 0));
  }
}

void topk_rows(const Tensor& logits, const Tensor& offsets, int k, const Tensor& tokens,
               const Tensor& logprobs) {
  const int64_t R = logits.shape[0], V = logits.shape[1];
  const int64_t* off = offsets.data ? offsets.ptr<int64_t>() : nullptr;
  std::vector<int32_t> ids(static_cast<size_t>(V));
  for (int64_t r = 0; r < R; ++r) {
    const float* x = logits.ptr<float>() + r * logits.stride[0];
    const auto key = [&](int32_t i) { return x[i] == x[i] ? x[i] : -std::numeric_limits<float>::infinity(); };
    for (int32_t i = 0; i < int32_t(V); ++i) ids[size_t(i)] = i;
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [&](int32_t a, int32_t b) { return key(a) > key(b) || (key(a) == key(b) && a < b); });
    const float m = x[ids[0]];
    float s = 0.0f;
    for (int64_t j = 0; j < V; ++j) s += std::exp(x[j] - m);  // float overloads: f32 terms, f32 sum
    const float log_s = std::log(s);
    for (int i = 0; i < k; ++i) {
      const int32_t id = ids[size_t(i)];
      tokens.ptr<int32_t>()[r * k + i] = int32_t(id + (off ? off[id] : 0));
      logprobs.ptr<float>()[r * k + i] = (x[id] - m) - log_s;
    }
  }
}

}  // namespace kiln::ops::cpu
