// Rotary cos/sin table shared by the CPU oracle and every kernel (so they read the same fp32 values).
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/rope.h"
#include "kiln/tensor.h"

namespace kiln::ops {

// f32 [max_pos, rotary_dim], contiguous. Row p: m * cos(p * f_j) at column j and m * sin(p * f_j) at column
// rotary_dim / 2 + j, for j in [0, rotary_dim / 2), f_j = rope_inv_freq(...)[j] and m the scaling's
// attention_factor (1 unless YaRN). Computed in double on the host, rounded once to f32.
struct RopeTable {
  Tensor cos_sin;
  int rotary_dim = 0;
};

// The inverse frequencies, in double, as transformers' modeling_rope_utils derives them:
//   none / dynamic: theta^(-2j / rotary_dim); linear: that / factor;
//   yarn: per pair, interpolation (/ factor) and extrapolation mixed by a linear ramp over the pair index
//   between the dimensions where the original context makes beta_fast and beta_slow rotations.
std::vector<double> rope_inv_freq(int rotary_dim, double theta, const RopeScaling& scaling);

// Builds the table in host double, rounds to f32 and copies it to `device`. rotary_dim even and > 0,
// theta > 0, max_pos > 0 (else kiln::Error).
Buffer build_rope_table(int rotary_dim, double theta, const RopeScaling& scaling, int64_t max_pos,
                        Device device);
inline Buffer build_rope_table(int rotary_dim, double theta, int64_t max_pos, Device device) {
  return build_rope_table(rotary_dim, theta, RopeScaling{}, max_pos, device);
}
// The RopeTable view of a buffer made by build_rope_table.
RopeTable rope_table_view(const Buffer& table, int rotary_dim, int64_t max_pos);

}  // namespace kiln::ops
