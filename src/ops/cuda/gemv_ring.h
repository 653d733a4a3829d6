// The ring GEMV's launcher (gemv_ring.cu), called by gemv() for the GemvConfig::ring configs; contract and
// summation order in gemv.h and gemv_ring.cu.
#pragma once

#include <cstdint>

#include "ops/cuda/gemv.h"

namespace kiln::cuda {

// The residual-norm prologue's operands (gemv.h: gemv_norm_in).
struct RingNormIn {
  const void* delta;
  int64_t ldd;
  void* residual;
  int64_t ldr;
  const void* norm_w;
  float eps;
};

// out = x · W^T with the epilogue epi (gemv.h), `warps` consumer warps a block (plus one producer warp);
// with ni, x is rms_norm(residual + delta) * norm_w computed in the block's prologue (x unused) and the
// residual rewritten, as gemv_norm_in. Arguments already validated by gemv() / gemv_norm_in(), except what
// only the ring needs (gemv_ring_fits, the device).
void gemv_ring(const void* x, int64_t ldx, const void* w, int64_t ldw, void* out, int64_t ldo, int64_t m,
               int64_t n, int64_t k, GemvEpilogue epi, int warps, cudaStream_t stream, bool pdl,
               const RingNormIn* ni = nullptr);

}  // namespace kiln::cuda
