// Memory-bound kernels; contracts in elementwise.h.
#include "ops/cuda/common.cuh"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/norm_row.cuh"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace {

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

struct EmbedParams {
  const int32_t* tokens;  // [T]
  const uint4* table;     // [V, H/8], row stride table_s (uint4 units)
  void* out;              // [T, H] bf16 or f32, row stride out_s (elements)
  int64_t table_s, out_s;
  int64_t T, V, H8;
  bool out_f32;
};

// Grid: (T); block 128; each thread copies 16-byte chunks of one row (f32: widened, two 16-byte stores).
__global__ void embedding_kernel(const __grid_constant__ EmbedParams p) {
  pdl_wait();
  const int64_t t = blockIdx.x;
  const int32_t tok = p.tokens[t];
  const bool ok = tok >= 0 && tok < p.V;
  for (int64_t c = threadIdx.x; c < p.H8; c += blockDim.x) {
    const uint4 v = ok ? p.table[int64_t(tok) * p.table_s + c] : make_uint4(0, 0, 0, 0);
    if (p.out_f32) {
      float f[8];
      unpack8(v, f);
      float4* o = reinterpret_cast<float4*>(static_cast<float*>(p.out) + t * p.out_s + c * 8);
      o[0] = make_float4(f[0], f[1], f[2], f[3]);
      o[1] = make_float4(f[4], f[5], f[6], f[7]);
    } else {
      reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + t * p.out_s)[c] = v;
    }
  }
  pdl_launch_dependents();
}

constexpr int kNormRowsPerBlock = 4;

struct NormParams {
  const uint16_t* x;   // [T, H], row stride xs
  uint16_t* residual;  // [T, H], row stride rs (add only)
  const uint4* w;      // [H/8]
  uint16_t* out;       // [T, H], row stride os
  int64_t xs, rs, os;
  int64_t T, H8;
  float eps;
  bool add;
};

// Grid: (ceil(T / 4)); block 4 warps, one row per warp: norm_row.cuh's rms_norm_row (lane l owns chunks
// l, l+32, ...; 16-byte loads; reduction order: rms_norm in elementwise.h), which the GEMV's add + RMSNorm
// epilogue (gemv.h) calls too.
__global__ void __launch_bounds__(kNormRowsPerBlock * 32)
    rms_norm_kernel(const __grid_constant__ NormParams p) {
  pdl_wait();
  const int64_t t = int64_t(blockIdx.x) * kNormRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= p.T) return;
  rms_norm_row<false>(reinterpret_cast<const uint4*>(p.x + t * p.xs),
                      reinterpret_cast<uint4*>(p.residual + (p.add ? t * p.rs : 0)), p.w,
                      reinterpret_cast<uint4*>(p.out + t * p.os), p.H8, p.eps, p.add, lane);
  pdl_launch_dependents();
}

struct SiluParams {
  const uint16_t* in;  // [T, 2I], row stride is
  uint16_t* out;       // [T, I], row stride os
  int64_t is, os;
  int64_t T, I8;
};

// Grid-stride over T * I/8 chunks; each thread: one 16-byte gate chunk, one up chunk, one output chunk.
__global__ void silu_mul_kernel(const __grid_constant__ SiluParams p) {
  pdl_wait();
  const int64_t n = p.T * p.I8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / p.I8, c = i % p.I8;
    const uint4* in = reinterpret_cast<const uint4*>(p.in + t * p.is);
    float g[8], u[8], y[8];
    unpack8(in[c], g);
    unpack8(in[p.I8 + c], u);
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = silu_mul_f32(g[j], u[j]);
    reinterpret_cast<uint4*>(p.out + t * p.os)[c] = pack8(y);
  }
  pdl_launch_dependents();
}

__global__ void round_bf16_kernel(float* x, int64_t rows, int64_t cols, int64_t ld) {
  pdl_wait();
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float* e = x + (i / cols) * ld + i % cols;
    *e = round_bf16(*e);
  }
  pdl_launch_dependents();
}

__global__ void bf16_to_f32_kernel(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = bf16_bits_to_f32(in[i]);
}

// SplitMix64 finaliser: a counter-based hash, so element i's value depends only on (seed, i).
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_random_kernel(uint16_t* dst, int64_t n, uint64_t seed, float scale, float offset) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
    const float u = float(int64_t(h >> 40)) * (1.0f / 8388608.0f) - 1.0f;  // 24 bits -> [-1, 1)
    dst[i] = uint16_t(f32_to_bf16_bits(offset + scale * u));
  }
}

__global__ void fill_splitmix_kernel(uint16_t* dst, int64_t n, uint64_t key, float center, float half_width) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = key + uint64_t(i) + 0x9e3779b97f4a7c15ull;  // splitmix64(key + i)
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    const float u = __fmul_rn(float(x >> 40), 1.0f / 16777216.0f);
    dst[i] = uint16_t(
        f32_to_bf16_bits(__fadd_rn(center, __fmul_rn(__fsub_rn(__fmul_rn(2.0f, u), 1.0f), half_width))));
  }
}

int grid_for(int64_t n, int threads) {
  int sms = 132;
  int dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int64_t blocks = (n + threads - 1) / threads;
  return int(blocks < int64_t(sms) * 8 ? (blocks > 0 ? blocks : 1) : int64_t(sms) * 8);
}

}  // namespace

void embedding_gather(const int32_t* tokens, const void* table, int64_t table_stride, void* out,
                      int64_t out_stride, bool out_f32, int64_t T, int64_t V, int64_t H, cudaStream_t stream,
                      bool pdl) {
  KILN_CHECK(T >= 0 && V > 0 && H > 0 && H % 8 == 0, "embedding_gather: bad shape T ", T, " V ", V, " H ", H);
  KILN_CHECK(table_stride % 8 == 0 && out_stride % 8 == 0 && table_stride >= H && out_stride >= H,
             "embedding_gather: row strides must be multiples of 8 and >= H");
  KILN_CHECK(aligned16(table) && aligned16(out), "embedding_gather: table and out must be 16-byte aligned");
  if (T == 0) return;
  const EmbedParams p{.tokens = tokens,
                      .table = static_cast<const uint4*>(table),
                      .out = out,
                      .table_s = table_stride / 8,
                      .out_s = out_stride,
                      .T = T,
                      .V = V,
                      .H8 = H / 8,
                      .out_f32 = out_f32};
  launch({.grid = dim3(unsigned(T)), .block = dim3(128), .stream = stream, .pdl = pdl}, embedding_kernel, p);
}

void rms_norm(const void* x, int64_t x_stride, void* residual, int64_t r_stride, const void* w, void* out,
              int64_t o_stride, int64_t T, int64_t H, float eps, bool add, cudaStream_t stream, bool pdl) {
  KILN_CHECK(T >= 0 && H > 0 && H % 8 == 0, "rms_norm: H must be a positive multiple of 8, got ", H);
  KILN_CHECK(x_stride % 8 == 0 && o_stride % 8 == 0 && (!add || r_stride % 8 == 0),
             "rms_norm: row strides must be multiples of 8 elements");
  KILN_CHECK(aligned16(x) && aligned16(w) && aligned16(out) && (!add || aligned16(residual)),
             "rms_norm: pointers must be 16-byte aligned");
  KILN_CHECK(!add || residual != nullptr, "rms_norm: the fused add needs a residual");
  KILN_CHECK(eps >= 0.0f, "rms_norm: eps must be >= 0");
  if (T == 0) return;
  const NormParams p{.x = static_cast<const uint16_t*>(x),
                     .residual = static_cast<uint16_t*>(residual),
                     .w = static_cast<const uint4*>(w),
                     .out = static_cast<uint16_t*>(out),
                     .xs = x_stride,
                     .rs = r_stride,
                     .os = o_stride,
                     .T = T,
                     .H8 = H / 8,
                     .eps = eps,
                     .add = add};
  launch({.grid = dim3(unsigned((T + kNormRowsPerBlock - 1) / kNormRowsPerBlock)),
          .block = dim3(kNormRowsPerBlock * 32),
          .stream = stream,
          .pdl = pdl},
         rms_norm_kernel, p);
}

void silu_mul(const void* in, int64_t in_stride, void* out, int64_t out_stride, int64_t T, int64_t I,
              cudaStream_t stream, bool pdl) {
  KILN_CHECK(T >= 0 && I > 0 && I % 8 == 0, "silu_mul: I must be a positive multiple of 8, got ", I);
  KILN_CHECK(in_stride % 8 == 0 && out_stride % 8 == 0, "silu_mul: row strides must be multiples of 8");
  KILN_CHECK(aligned16(in) && aligned16(out), "silu_mul: pointers must be 16-byte aligned");
  if (T == 0) return;
  const SiluParams p{.in = static_cast<const uint16_t*>(in),
                     .out = static_cast<uint16_t*>(out),
                     .is = in_stride,
                     .os = out_stride,
                     .T = T,
                     .I8 = I / 8};
  launch({.grid = dim3(unsigned(grid_for(T * I / 8, 256))), .block = dim3(256), .stream = stream, .pdl = pdl},
         silu_mul_kernel, p);
}

void round_f32_to_bf16(float* x, int64_t rows, int64_t cols, int64_t ld, cudaStream_t stream, bool pdl) {
  KILN_CHECK(rows >= 0 && cols >= 0 && ld >= cols, "round_f32_to_bf16: bad shape");
  if (rows == 0 || cols == 0) return;
  launch(
      {.grid = dim3(unsigned(grid_for(rows * cols, 256))), .block = dim3(256), .stream = stream, .pdl = pdl},
      round_bf16_kernel, x, rows, cols, ld);
}

void bf16_to_f32(const void* in, float* out, int64_t n, cudaStream_t stream) {
  KILN_CHECK(n >= 0, "bf16_to_f32: negative size");
  if (n == 0) return;
  launch({.grid = dim3(unsigned(grid_for(n, 256))), .block = dim3(256), .stream = stream}, bf16_to_f32_kernel,
         static_cast<const uint16_t*>(in), out, n);
}

void fill_random_bf16(void* dst, int64_t n, uint64_t seed, float scale, float offset, cudaStream_t stream) {
  KILN_CHECK(n >= 0, "fill_random_bf16: negative size");
  if (n == 0) return;
  launch({.grid = dim3(unsigned(grid_for(n, 256))), .block = dim3(256), .stream = stream}, fill_random_kernel,
         static_cast<uint16_t*>(dst), n, seed, scale, offset);
}

void fill_uniform_splitmix_bf16(void* dst, int64_t n, uint64_t key, float center, float half_width,
                                cudaStream_t stream) {
  KILN_CHECK(n >= 0, "fill_uniform_splitmix_bf16: negative size");
  if (n == 0) return;
  launch({.grid = dim3(unsigned(grid_for(n, 256))), .block = dim3(256), .stream = stream},
         fill_splitmix_kernel, static_cast<uint16_t*>(dst), n, key, center, half_width);
}

}  // namespace kiln::cuda
