#include <cmath>

#include "ops/cpu/parallel.h"
#include "ops/cpu/reference.h"

namespace kiln::ops::cpu {

void silu_and_mul(const Tensor& gate_up, const Tensor& out) {
  const int64_t M = out.shape[0], I = out.shape[1];
  parallel_for(M, 8, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const bf16_t* g = gate_up.ptr<bf16_t>() + m * gate_up.stride[0];
      const bf16_t* u = g + I;
      bf16_t* o = out.ptr<bf16_t>() + m * out.stride[0];
      for (int64_t i = 0; i < I; ++i) {
        const float gf = bf16_to_f32(g[i]);
        const float a = bf16_to_f32(f32_to_bf16(gf / (1.0f + std::exp(-gf))));
        o[i] = f32_to_bf16(a * bf16_to_f32(u[i]));
      }
    }
  });
}

}  // namespace kiln::ops::cpu
