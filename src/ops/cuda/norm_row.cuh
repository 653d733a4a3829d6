// One row of the (fused residual-add +) RMSNorm of elementwise.h's rms_norm, run by one whole warp. The
// rms_norm kernel calls it for its rows, and the GEMV with the add + RMSNorm epilogue (gemv.h,
// gemv_add_rms_norm) calls it in its last block, so the two give bitwise the same residual and output by
// construction. Formula, rounding points and summation order: elementwise.h's rms_norm.
#pragma once

#include <cstdint>

#include "ops/cuda/vec.cuh"

namespace kiln::cuda {

// Rows of up to 32 * kRegChunks chunks of 8 (kNormRegChunks: H <= 4096) are loaded whole into registers
// before any arithmetic, so every load of the row is in flight at once; longer rows (or kRegChunks 0) take a
// two-pass loop that re-reads r (this lane's own writes), kBatch chunks of loads in flight at a time. Every
// path sums in the same order (lane l: chunks l, l + 32, ... in turn, then the butterfly), so all agree
// bitwise. Callers short of registers (the GEMV's epilogue: a 128-register cap, where the 48 uint4 of the
// whole-row cache spilled ~1.3 KB a thread) pass kRegChunks 0.
constexpr int kNormRegChunks = 16;

// The row arithmetic, shared by rms_norm_row and the GEMV's residual-norm prologue (gemv_kernels.cuh) so
// that both give the same bits by construction.
// One chunk's residual add: h = bf16(residual + x), elementwise.
__device__ __forceinline__ uint4 norm_add_chunk(const uint4& xv, const uint4& rv) {
  float r[8], a[8];
  unpack8(xv, r);
  unpack8(rv, a);
#pragma unroll
  for (int j = 0; j < 8; ++j) r[j] = round_bf16(a[j] + r[j]);
  return pack8(r);
}
// acc += the chunk's squares, elements in order.
__device__ __forceinline__ void norm_square_chunk(const uint4& hv, float& acc) {
  float r[8];
  unpack8(hv, r);
#pragma unroll
  for (int j = 0; j < 8; ++j) acc = fmaf(r[j], r[j], acc);
}
// The warp's lane sums (xor butterfly 16 .. 1) to 1 / sqrt(mean + eps); every lane gets it.
__device__ __forceinline__ float norm_inv_rms(float acc, int64_t H8, float eps) {
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(acc, float(H8 * 8)) + eps));
}
// The normalized chunk: bf16(bf16(h * inv) * w).
__device__ __forceinline__ uint4 norm_scale_chunk(const uint4& hv, const uint4& wr, float inv) {
  float r[8], w[8], y[8];
  unpack8(hv, r);
  unpack8(wr, w);
#pragma unroll
  for (int j = 0; j < 8; ++j) y[j] = round_bf16(r[j] * inv) * w[j];
  return pack8(y);
}

// x, residual, out: the row's 16-byte chunks (H8 = H / 8 of them); w: the norm weight's. lane: 0..31 (all
// 32 lanes of the warp call this together). residual is read and rewritten when add (unused otherwise).
// kCoherentX: x is read through L2 (ld.global.cg), never the read-only path, because other blocks of the
// same kernel wrote it (the GEMV epilogue); the values read are the same either way.
template <bool kCoherentX, int kRegChunks = kNormRegChunks>
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
  // One chunk's residual add (when add; the sum rounded to bf16 and stored) and its squares into acc.
  const auto add_square = [&](uint4& xv, const uint4& rv, int64_t c, float& acc) {
    if (add) {
      xv = norm_add_chunk(xv, rv);
      res[c] = xv;
    }
    norm_square_chunk(xv, acc);
  };
  const auto scale_store = [&](const uint4& xv, const uint4& wr, int64_t c, float inv) {
    out[c] = norm_scale_chunk(xv, wr, inv);
  };
  const auto inv_rms = [&](float acc) { return norm_inv_rms(acc, H8, eps); };
  float acc = 0.0f;
  if constexpr (kRegChunks > 0) {
    if (H8 <= 32 * kRegChunks) {
      uint4 xv[kRegChunks], rv[kRegChunks], wr[kRegChunks];
#pragma unroll
      for (int i = 0; i < kRegChunks; ++i) {
        const int64_t c = lane + 32 * i;
        if (c < H8) {
          xv[i] = load_x(c);
          wr[i] = wv[c];
          if (add) rv[i] = res[c];
        }
      }
#pragma unroll
      for (int i = 0; i < kRegChunks; ++i) {
        const int64_t c = lane + 32 * i;
        if (c < H8) add_square(xv[i], rv[i], c, acc);
      }
      const float inv = inv_rms(acc);
#pragma unroll
      for (int i = 0; i < kRegChunks; ++i) {
        const int64_t c = lane + 32 * i;
        if (c < H8) scale_store(xv[i], wr[i], c, inv);
      }
      return;
    }
  }
  constexpr int kBatch = 4;
  for (int64_t c0 = lane; c0 < H8; c0 += 32 * kBatch) {
    uint4 xv[kBatch], rv[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t c = c0 + 32 * i;
      if (c < H8) {
        xv[i] = load_x(c);
        if (add) rv[i] = res[c];
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t c = c0 + 32 * i;
      if (c < H8) add_square(xv[i], rv[i], c, acc);
    }
  }
  const float inv = inv_rms(acc);
  for (int64_t c0 = lane; c0 < H8; c0 += 32 * kBatch) {
    uint4 xv[kBatch], wr[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t c = c0 + 32 * i;
      if (c < H8) {
        xv[i] = add ? res[c] : load_x(c);
        wr[i] = wv[c];
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t c = c0 + 32 * i;
      if (c < H8) scale_store(xv[i], wr[i], c, inv);
    }
  }
}

}  // namespace kiln::cuda
