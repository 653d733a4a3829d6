// The vision tower's variable-length bidirectional attention (contract: ops/vision_attention.h): raw-pointer
// parameters and the launchers of its two kernels, so the dispatcher (vision.cu) and the kernel benchmark
// (bench/vision_attention_bench.cpp) call the same code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln::cuda {

struct VarlenAttnParams {
  const uint16_t* q;  // bf16 [T, Hn, D], strides qs (token), qh (head), 1
  const uint16_t* k;  // bf16 [T, Hn, D], strides ks, kh, 1
  const uint16_t* v;  // bf16 [T, Hn, D], strides vs, vh, 1
  const int32_t* cu;  // i32 [S + 1] on the device: cu[0] = 0, non-decreasing, cu[S] = T
  uint16_t* out;      // bf16 [T, Hn, D], strides os, oh, 1; not aliasing q, k or v
  int64_t qs, qh, ks, kh, vs, vh, os, oh, T, Hn;
  int32_t S, D;
  float scale;
};

// The tensor-core kernel (vision_attention.cu) takes D 64 and 128 where every pointer is 16-byte aligned,
// every token and head stride a multiple of 8 elements and scale finite and > 0; the SIMT kernel (vision.cu)
// every other case.
bool varlen_attention_mma_applies(const VarlenAttnParams& p);
// The query rows of one block of the tensor-core kernel: 64, or 128 (D 64 only) where the launch has enough
// blocks of 128 rows to fill the device (see vision_attention.cu).
int varlen_attention_mma_tile_rows(const VarlenAttnParams& p);
// Needs _applies; tile_rows 0: varlen_attention_mma_tile_rows(p), else 64 or 128 (D 64) as given.
void launch_varlen_attention_mma(const VarlenAttnParams& p, cudaStream_t stream, int tile_rows = 0);
void launch_varlen_attention_simt(const VarlenAttnParams& p, cudaStream_t stream);  // D 16/32/64/72/80/128
// The dispatcher's choice: the tensor-core kernel where it applies, else the SIMT one. Nothing is launched
// for T == 0. No host synchronization (cu stays on the device: each block finds its segment there).
void launch_varlen_attention(const VarlenAttnParams& p, cudaStream_t stream);

}  // namespace kiln::cuda
