#include <cstring>

#include "ops/cpu/parallel.h"
#include "ops/cpu/reference.h"

namespace kiln::ops::cpu {

void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const int64_t T = ids.shape[0], H = table.shape[1], V = table.shape[0];
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    KILN_CHECK(id[t] >= 0 && id[t] < V, "embedding: id ", id[t], " at row ", t, " out of range [0, ", V, ")");
  }
  parallel_for(T, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const bf16_t* src = table.ptr<bf16_t>() + id[t] * table.stride[0];
      if (out.dtype == DType::bf16) {
        std::memcpy(out.ptr<bf16_t>() + t * out.stride[0], src, size_t(H) * sizeof(bf16_t));
      } else {
        float* dst = out.ptr<float>() + t * out.stride[0];
        for (int64_t i = 0; i < H; ++i) dst[i] = bf16_to_f32(src[i]);
      }
    }
  });
}

}  // namespace kiln::ops::cpu
