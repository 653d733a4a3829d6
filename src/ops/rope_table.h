// Rotary cos/sin table shared by the CPU oracle and every kernel (so they read the same fp32 values).
#pragma once

#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::ops {

// f32 [max_pos, rotary_dim], contiguous. Row p: cos(p * f_j) at column j and sin(p * f_j) at column
// rotary_dim / 2 + j, for j in [0, rotary_dim / 2), f_j = theta^(-2j / rotary_dim). Computed in double on
// the host, rounded once to f32.
struct RopeTable {
  Tensor cos_sin;
  int rotary_dim = 0;
};

// Builds the table in host double, rounds to f32 and copies it to `device`. rotary_dim even and > 0,
// theta > 0, max_pos > 0 (else kiln::Error).
Buffer build_rope_table(int rotary_dim, double theta, int64_t max_pos, Device device);
// The RopeTable view of a buffer made by build_rope_table.
RopeTable rope_table_view(const Buffer& table, int rotary_dim, int64_t max_pos);

}  // namespace kiln::ops
