#include "ops/rope_table.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kiln::ops {

namespace {

// The pair index at which a wavelength fits `rotations` times into `context` positions (YaRN's inverse
// dimension formula), in units of pairs of a rotary_dim-wide rotation.
double yarn_correction_dim(double rotations, int rotary_dim, double theta, double context) {
  return double(rotary_dim) * std::log(context / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(theta));
}

}  // namespace

std::vector<double> rope_inv_freq(int rotary_dim, double theta, const RopeScaling& s) {
  KILN_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rotary_dim must be even and positive, got ", rotary_dim);
  KILN_CHECK(theta > 0 && std::isfinite(theta), "rope theta must be finite and positive, got ", theta);
  KILN_CHECK(s.factor > 0 && std::isfinite(s.factor), "rope scaling factor must be positive, got ", s.factor);
  const int half = rotary_dim / 2;
  std::vector<double> freq(static_cast<size_t>(half));
  for (int j = 0; j < half; ++j) freq[size_t(j)] = std::pow(theta, -2.0 * j / rotary_dim);
  if (s.kind == RopeScalingKind::linear) {
    for (double& f : freq) f /= s.factor;
  } else if (s.kind == RopeScalingKind::yarn) {
    KILN_CHECK(s.original_max_position > 0, "YaRN needs original_max_position > 0");
    const double ctx = double(s.original_max_position);
    double low = yarn_correction_dim(s.beta_fast, rotary_dim, theta, ctx);
    double high = yarn_correction_dim(s.beta_slow, rotary_dim, theta, ctx);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(rotary_dim - 1));
    if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
    for (int j = 0; j < half; ++j) {
      // ramp 0: extrapolate (high-frequency pairs keep their frequency); 1: interpolate (divide by factor).
      const double ramp = std::clamp((double(j) - low) / (high - low), 0.0, 1.0);
      const double extra = freq[size_t(j)], inter = freq[size_t(j)] / s.factor;
      freq[size_t(j)] = inter * ramp + extra * (1.0 - ramp);
    }
  }
  return freq;
}

Buffer build_rope_table(int rotary_dim, double theta, const RopeScaling& scaling, int64_t max_pos,
                        Device device) {
  KILN_CHECK(max_pos > 0, "rope table needs max_pos > 0, got ", max_pos);
  const double m = scaling.kind == RopeScalingKind::yarn ? scaling.attention_factor : 1.0;
  KILN_CHECK(m > 0 && std::isfinite(m), "rope attention_factor must be positive, got ", m);
  const std::vector<double> freq = rope_inv_freq(rotary_dim, theta, scaling);
  const int half = rotary_dim / 2;
  std::vector<float> host(size_t(max_pos) * size_t(rotary_dim));
  for (int64_t p = 0; p < max_pos; ++p) {
    float* row = host.data() + p * rotary_dim;
    for (int j = 0; j < half; ++j) {
      const double a = double(p) * freq[size_t(j)];
      row[j] = float(m * std::cos(a));
      row[half + j] = float(m * std::sin(a));
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
