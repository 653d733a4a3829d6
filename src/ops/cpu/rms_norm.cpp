#include "ops/rms_norm.h"

#include <cmath>
#include <vector>

#include "ops/cpu/parallel.h"
#include "ops/cpu/reference.h"

namespace kiln::ops {

float rms_sum_squares(const float* x, int64_t n) {
  float p[32] = {};
  for (int64_t i = 0; i < n; ++i) p[(i / 8) % 32] = std::fma(x[i], x[i], p[(i / 8) % 32]);
  // xor butterfly: after each stage lanes l and l ^ o hold the same (commutative) sum.
  for (int o = 16; o >= 1; o /= 2) {
    float q[32];
    for (int l = 0; l < 32; ++l) q[l] = p[l] + p[l ^ o];
    for (int l = 0; l < 32; ++l) p[l] = q[l];
  }
  return p[0];
}

namespace cpu {
namespace {

// One row: xf holds the row widened to fp32; writes out = bf16(bf16(x * r) * w).
void norm_row(const float* xf, const bf16_t* w, int64_t H, float eps, bf16_t* out) {
  const float s = rms_sum_squares(xf, H);
  const float r = 1.0f / std::sqrt(s / float(H) + eps);  // IEEE division and sqrt: correctly rounded
  for (int64_t i = 0; i < H; ++i) {
    const float n = bf16_to_f32(f32_to_bf16(xf[i] * r));
    out[i] = f32_to_bf16(n * bf16_to_f32(w[i]));
  }
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  const int64_t T = x.shape[0], H = x.shape[1];
  parallel_for(T, 16, [&](int64_t t0, int64_t t1) {
    std::vector<float> xf(static_cast<size_t>(H));
    for (int64_t t = t0; t < t1; ++t) {
      const bf16_t* xr = x.ptr<bf16_t>() + t * x.stride[0];
      for (int64_t i = 0; i < H; ++i) xf[size_t(i)] = bf16_to_f32(xr[i]);
      norm_row(xf.data(), weight.ptr<bf16_t>(), H, eps, out.ptr<bf16_t>() + t * out.stride[0]);
    }
  });
}

void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                  const Tensor& out) {
  const int64_t T = x.shape[0], H = x.shape[1];
  parallel_for(T, 16, [&](int64_t t0, int64_t t1) {
    std::vector<float> xf(static_cast<size_t>(H));
    for (int64_t t = t0; t < t1; ++t) {
      const bf16_t* xr = x.ptr<bf16_t>() + t * x.stride[0];
      bf16_t* rr = residual.ptr<bf16_t>() + t * residual.stride[0];
      for (int64_t i = 0; i < H; ++i) {
        rr[i] = f32_to_bf16(bf16_to_f32(rr[i]) + bf16_to_f32(xr[i]));
        xf[size_t(i)] = bf16_to_f32(rr[i]);
      }
      norm_row(xf.data(), weight.ptr<bf16_t>(), H, eps, out.ptr<bf16_t>() + t * out.stride[0]);
    }
  });
}

}  // namespace cpu
}  // namespace kiln::ops
