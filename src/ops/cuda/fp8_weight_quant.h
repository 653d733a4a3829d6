// Online quantization (--quantization fp8) of a bf16 weight on the GPU: ops/fp8_linear.h's
// quantize_weight_fp8 contract (DeepGEMM's per_block_cast_to_fp8 as torch evaluates it), bitwise the CPU
// oracle, so a model quantized at load on the GPU holds the same e4m3 bytes and scales as one quantized on
// the host. Used by the loader for the MoE experts (tens of GB at load: model/fp8_weights.h).
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

// Per 128 x 128 block of w: a = max(max |f32(w)|, 1e-4f), m = f32(f32(1 / a) * 448),
// q = e4m3_rn_sat(f32(f32(w) * m)), scale = f32(a / 448) (each operation correctly rounded, no fma).
//   w: bf16 [n, k] contiguous;  q: e4m3 [n, k] contiguous;  scale: f32 [ceil(n/128), ceil(k/128)] contiguous.
//   nonfinite: a device i32; where w holds a non-finite value, atomicMin(nonfinite, tag) (the caller sets it
//   to INT32_MAX first, reads it after the stream is done and names the tensor `tag`); q and scale are then
//   unspecified.
// Enqueued on `stream`; no host synchronisation.
void quantize_weight_fp8(const uint16_t* w, int64_t n, int64_t k, uint8_t* q, float* scale,
                         int32_t* nonfinite, int32_t tag, cudaStream_t stream);

}  // namespace kiln::cuda
