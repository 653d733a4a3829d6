// One row of the (fused residual-add +) RMSNorm of elementwise.h's rms_norm, run by one whole warp. The
// rms_norm kernel calls it for its rows, and the GEMV with the add + RMSNorm epilogue (gemv.h,
// gemv_add_rms_norm) calls it in its last block, so the two give bitwise the same residual and output by
// construction. Formula, rounding points and summation order: elementwise.h's rms_norm.
#pragma once

#include <cstdint>

#include "ops/cuda/vec.cuh"

namespace kiln::cuda {

// Rows of up to 32 * kNormRegChunks chunks of 8 (H <= 4096) are loaded whole into registers before any
// arithmetic, so every load of the row is in flight at once; longer rows take a two-pass loop that re-reads
// r (this lane's own writes). Both paths sum identically.
constexpr int kNormRegChunks = 16;

// x, residual, out: the row's 16-byte chunks (H8 = H / 8 of them); w: the norm weight's. lane: 0..31 (all
// 32 lanes of the warp call this together). residual is read and rewritten when add (unused otherwise).
// kCoherentX: x is read through L2 (ld.global.cg), never the read-only path, because other blocks of the
// same kernel wrote it (the GEMV epilogue); the values read are the same either way.
template <bool kCoherentX>
__device__ __forceinline__ void rms_norm_row(const uint4* __restrict__ x, uint4* __restrict__ res,
                                             const uint4* __restrict__ wv, uint4* __restrict__ out,
                                             int64_t H8, float eps, bool add, int lane) {
  const auto load_x = [&](int64_t c) {
    if constexpr (kCoherentX) {
      return __ldcg(x + c);
    } else {
      return x[c];
    }
  };
  float acc = 0.0f;
  if (H8 <= 32 * kNormRegChunks) {
    uint4 xv[kNormRegChunks], rv[kNormRegChunks], wr[kNormRegChunks];
#pragma unroll
    for (int i = 0; i < kNormRegChunks; ++i) {
      const int64_t c = lane + 32 * i;
      if (c < H8) {
        xv[i] = load_x(c);
        wr[i] = wv[c];
        if (add) rv[i] = res[c];
      }
    }
#pragma unroll
    for (int i = 0; i < kNormRegChunks; ++i) {
      const int64_t c = lane + 32 * i;
      if (c < H8) {
        float r[8];
        unpack8(xv[i], r);
        if (add) {
          float a[8];
          unpack8(rv[i], a);
#pragma unroll
          for (int j = 0; j < 8; ++j) r[j] = round_bf16(a[j] + r[j]);
          xv[i] = pack8(r);
          res[c] = xv[i];
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) acc = fmaf(r[j], r[j], acc);
      }
    }
#pragma unroll
    for (int off = 16; off >= 1; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(acc, float(H8 * 8)) + eps));
#pragma unroll
    for (int i = 0; i < kNormRegChunks; ++i) {
      const int64_t c = lane + 32 * i;
      if (c < H8) {
        float r[8], w[8], y[8];
        unpack8(xv[i], r);
        unpack8(wr[i], w);
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = round_bf16(r[j] * inv) * w[j];
        out[c] = pack8(y);
      }
    }
  } else {
    for (int64_t c = lane; c < H8; c += 32) {
      float r[8];
      unpack8(load_x(c), r);
      if (add) {
        float a[8];
        unpack8(res[c], a);
#pragma unroll
        for (int j = 0; j < 8; ++j) r[j] = round_bf16(a[j] + r[j]);
        res[c] = pack8(r);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) acc = fmaf(r[j], r[j], acc);
    }
#pragma unroll
    for (int off = 16; off >= 1; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(acc, float(H8 * 8)) + eps));
    for (int64_t c = lane; c < H8; c += 32) {
      float r[8], w[8], y[8];
      unpack8(add ? res[c] : load_x(c), r);
      unpack8(wv[c], w);
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = round_bf16(r[j] * inv) * w[j];
      out[c] = pack8(y);
    }
  }
}

}  // namespace kiln::cuda
