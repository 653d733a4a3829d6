// The bf16 row ops of ops/rows.h on the GPU: elementwise add and the image-row scatter (copy or add).
// Memory-bound and small (a few image rows per step), so one plain element per thread; bitwise the CPU
// reference (one fp32 add rounded to nearest even).
#include "ops/cuda/common.cuh"
#include "ops/cuda/context.h"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/vec.cuh"

namespace kiln::ops::cuda {
namespace {

struct AddParams {
  const uint16_t* a;  // [M, N], row stride as
  const uint16_t* b;  // [M, N], row stride bs
  uint16_t* out;      // [M, N], row stride os
  int64_t as, bs, os, M, N;
};

// Grid-stride over M * N elements; each thread one element: out = bf16(a + b).
__global__ void add_kernel(const __grid_constant__ AddParams p) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < p.M * p.N;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / p.N, n = i % p.N;
    const float v = __uint_as_float(uint32_t(p.a[m * p.as + n]) << 16) +
                    __uint_as_float(uint32_t(p.b[m * p.bs + n]) << 16);
    p.out[m * p.os + n] = uint16_t(::kiln::cuda::f32_to_bf16_bits(v));
  }
}

struct ScatterParams {
  uint16_t* dst;        // [T, H], row stride ds
  const int32_t* rows;  // [n]
  const uint16_t* src;  // [n, H], row stride ss
  int64_t ds, ss, T, n, H;
  bool accumulate;
};

// Grid-stride over n * H elements; each thread one element of one scattered row (rows outside [0, T)
// are skipped).
__global__ void scatter_kernel(const __grid_constant__ ScatterParams p) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < p.n * p.H;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.H, c = i % p.H;
    const int32_t row = p.rows[r];
    if (row < 0 || row >= p.T) continue;
    uint16_t* d = p.dst + int64_t(row) * p.ds + c;
    const uint16_t s = p.src[r * p.ss + c];
    if (p.accumulate) {
      const float v = __uint_as_float(uint32_t(*d) << 16) + __uint_as_float(uint32_t(s) << 16);
      *d = uint16_t(::kiln::cuda::f32_to_bf16_bits(v));
    } else {
      *d = s;
    }
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return unsigned(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

}  // namespace

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t M = a.shape[0], N = a.shape[1];
  if (M * N == 0) return;
  const AddParams p{.a = a.ptr<uint16_t>(),
                    .b = b.ptr<uint16_t>(),
                    .out = out.ptr<uint16_t>(),
                    .as = a.stride[0],
                    .bs = b.stride[0],
                    .os = out.stride[0],
                    .M = M,
                    .N = N};
  ::kiln::cuda::launch(
      {.grid = dim3(blocks_for(M * N)), .block = dim3(256), .stream = ::kiln::cuda::current_stream()},
      add_kernel, p);
}

void scatter_rows(const Tensor& dst, const Tensor& rows, const Tensor& src, bool accumulate) {
  const int64_t n = rows.shape[0], H = dst.shape[1];
  if (n * H == 0) return;
  const ScatterParams p{.dst = dst.ptr<uint16_t>(),
                        .rows = rows.ptr<int32_t>(),
                        .src = src.ptr<uint16_t>(),
                        .ds = dst.stride[0],
                        .ss = src.stride[0],
                        .T = dst.shape[0],
                        .n = n,
                        .H = H,
                        .accumulate = accumulate};
  ::kiln::cuda::launch(
      {.grid = dim3(blocks_for(n * H)), .block = dim3(256), .stream = ::kiln::cuda::current_stream()},
      scatter_kernel, p);
}

}  // namespace kiln::ops::cuda
