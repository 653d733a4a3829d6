// The any-shape GEMM (contract in gemm_any.h).
#include "kiln/error.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm_any.h"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace {

constexpr int kTile = 64;      // output rows and columns per block
constexpr int kStep = 16;      // K columns staged in shared memory per step
constexpr int kThreads = 256;  // 16 x 16 threads, each owning a 4 x 4 block of outputs

struct GemmAnyParams {
  const uint16_t* x;  // bf16 [M, K], row stride ldx
  const uint16_t* w;  // bf16 [N, K], row stride ldw
  void* out;          // bf16 or f32 [M, N], row stride ldo
  int64_t ldx, ldw, ldo, m, n, k;
  bool out_f32;
};

// Grid: (ceil(N / 64), ceil(M / 64)); block 256 = 16 x 16 threads. A block owns a 64 x 64 output tile; per K
// step it stages x[64 rows][16] and W[64 rows][16] in shared memory with scalar, bounds-checked loads (zeros
// outside [0, M) x [0, N) x [0, K)), so any shape, stride and alignment is read correctly. Thread (ty, tx)
// owns rows ty + 16 i and columns tx + 16 j (i, j < 4) and accumulates them in fp32 in ascending k; it writes
// each in-range output once (bf16: rounded to nearest even; f32: as summed).
__global__ void __launch_bounds__(kThreads) gemm_any_kernel(const __grid_constant__ GemmAnyParams p) {
  pdl_wait();
  __shared__ float xs[kTile][kStep + 1];
  __shared__ float ws[kTile][kStep + 1];
  const int tx = int(threadIdx.x % 16), ty = int(threadIdx.x / 16);
  const int64_t row0 = int64_t(blockIdx.y) * kTile, col0 = int64_t(blockIdx.x) * kTile;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < p.k; k0 += kStep) {
    for (int e = int(threadIdx.x); e < kTile * kStep; e += kThreads) {
      const int r = e / kStep, c = e % kStep;
      const int64_t kk = k0 + c, xr = row0 + r, wr = col0 + r;
      xs[r][c] = xr < p.m && kk < p.k ? bf16_bits_to_f32(p.x[xr * p.ldx + kk]) : 0.0f;
      ws[r][c] = wr < p.n && kk < p.k ? bf16_bits_to_f32(p.w[wr * p.ldw + kk]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kStep; ++c) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[ty + 16 * i][c];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[tx + 16 * j][c];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  pdl_launch_dependents();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = row0 + ty + 16 * i;
    if (r >= p.m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = col0 + tx + 16 * j;
      if (c >= p.n) continue;
      if (p.out_f32)
        static_cast<float*>(p.out)[r * p.ldo + c] = acc[i][j];
      else
        static_cast<uint16_t*>(p.out)[r * p.ldo + c] = uint16_t(f32_to_bf16_bits(acc[i][j]));
    }
  }
}

}  // namespace

void gemm_any(const void* x, int64_t ldx, const void* w, int64_t ldw, void* out, int64_t ldo, int64_t m,
              int64_t n, int64_t k, bool out_f32, cudaStream_t stream, bool pdl) {
  KILN_CHECK(m > 0 && n > 0 && k > 0, "gemm_any: shape must be positive: M ", m, " N ", n, " K ", k);
  KILN_CHECK(ldx >= k && ldw >= k && ldo >= n, "gemm_any: row strides must be >= the row length: ldx ", ldx,
             " ldw ", ldw, " ldo ", ldo);
  KILN_CHECK(reinterpret_cast<uintptr_t>(x) % 2 == 0 && reinterpret_cast<uintptr_t>(w) % 2 == 0 &&
                 reinterpret_cast<uintptr_t>(out) % (out_f32 ? 4 : 2) == 0,
             "gemm_any: operands must be aligned to their element size");
  const int64_t gx = (n + kTile - 1) / kTile, gy = (m + kTile - 1) / kTile;
  KILN_CHECK(gx <= 0x7fffffff && gy <= 65535, "gemm_any: M ", m, " N ", n, " too large for one launch");
  const GemmAnyParams p{.x = static_cast<const uint16_t*>(x),
                        .w = static_cast<const uint16_t*>(w),
                        .out = out,
                        .ldx = ldx,
                        .ldw = ldw,
                        .ldo = ldo,
                        .m = m,
                        .n = n,
                        .k = k,
                        .out_f32 = out_f32};
  launch({.grid = dim3(unsigned(gx), unsigned(gy)), .block = dim3(kThreads), .stream = stream, .pdl = pdl},
         gemm_any_kernel, p);
}

}  // namespace kiln::cuda
