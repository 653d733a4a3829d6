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

}  // namespace kiln::ops::cpu
