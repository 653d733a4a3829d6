#include "ops/rope_table.h"

#include <cmath>
#include <vector>

namespace kiln::ops {

Buffer build_rope_table(int rotary_dim, double theta, int64_t max_pos, Device device) {
  KILN_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rotary_dim must be even and positive, got ", rotary_dim);
  KILN_CHECK(theta > 0 && std::isfinite(theta), "rope theta must be finite and positive, got ", theta);
  KILN_CHECK(max_pos > 0, "rope table needs max_pos > 0, got ", max_pos);
  const int half = rotary_dim / 2;
  std::vector<double> freq(half);
  for (int j = 0; j < half; ++j) freq[j] = std::pow(theta, -2.0 * j / rotary_dim);
  std::vector<float> host(size_t(max_pos) * rotary_dim);
  for (int64_t p = 0; p < max_pos; ++p) {
    float* row = host.data() + p * rotary_dim;
    for (int j = 0; j < half; ++j) {
      const double a = double(p) * freq[j];
      row[j] = float(std::cos(a));
      row[half + j] = float(std::sin(a));
    }
  }
  Buffer buf(host.size() * sizeof(float), device);
  copy_bytes(buf.data(), device, host.data(), Device::cpu(), host.size() * sizeof(float));
  return buf;
}

RopeTable rope_table_view(const Buffer& table, int rotary_dim, int64_t max_pos) {
  return RopeTable{table.view(DType::f32, {max_pos, rotary_dim}), rotary_dim};
}

}  // namespace kiln::ops
