// The CPU oracle of the block-FP8 linear family (ops/fp8_linear.h; docs/NUMERICS.md "Block-FP8 linear
// layers"). Called through the dispatchers in ops/fp8_linear.cpp, which validate the arguments first.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/dtype.h"
#include "kiln/tensor.h"

namespace kiln::ops::cpu {

// One activation group of n (1..128) bf16 values: writes n e4m3 bytes to q, returns the group's scale a_s.
float quantize_act_group(const bf16_t* x, int64_t n, uint8_t* q);

void quantize_act_fp8(const Tensor& x, const Tensor& q, const Tensor& scale);
void linear_fp8_w8a8(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor& out);
void linear_fp8_weight_only(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor& out);
void linear_fp8_chunk16(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor& out,
                        int threads);
void quantize_weight_fp8(const Tensor& w, const Tensor& q, const Tensor& scale, const std::string& name);
void dequantize_fp8(const Tensor& weight, const Tensor& scale, const Tensor& out);

}  // namespace kiln::ops::cpu
