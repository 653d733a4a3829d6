// The Qwen3-VL vision tower's kernels (contracts: ops/layer_norm.h, ops/activation.h gelu, ops/linear.h
// linear_bias, ops/vision_attention.h, ops/vision_pos_embed.h). Simple, correct SIMT kernels: the tower runs
// once per image, and its GEMMs (cuBLASLt, through the GEMM engine) dominate everywhere but in attention at
// large images, which runs on tensor cores (vision_attention.cu) for head_dim 64 and 128; the SIMT attention
// here takes the others.
#include <cfloat>

#include "ops/cuda/common.cuh"
#include "ops/cuda/context.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/vec.cuh"
#include "ops/cuda/vision_attention.h"

namespace kiln::ops::cuda {
namespace {
namespace kc = ::kiln::cuda;

__device__ __forceinline__ float bf(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}
__device__ __forceinline__ uint16_t to_bf(float f) {
  return uint16_t(kc::f32_to_bf16_bits(f));
}
unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 8192 ? (b > 0 ? b : 1) : 8192);
}

struct LayerNormParams {
  const uint16_t* x;  // [T, H], row stride xs
  const uint16_t* w;  // [H]
  const uint16_t* b;  // [H]
  uint16_t* out;      // [T, H], row stride os
  int64_t xs, os, H;
  float eps;
};

// Grid: (T); block 256: one row per block. Moments in fp64 (block reduction through shared memory), then
// y = bf16((x - float(mean)) * float(1 / sqrt(var + eps)) * w + b), as the CPU reference.
__global__ void layer_norm_kernel(const __grid_constant__ LayerNormParams p) {
  __shared__ double red[256];
  const uint16_t* x = p.x + blockIdx.x * p.xs;
  double s = 0;
  for (int64_t i = threadIdx.x; i < p.H; i += blockDim.x) s += double(bf(x[i]));
  red[threadIdx.x] = s;
  __syncthreads();
  for (int o = 128; o > 0; o /= 2) {
    if (threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
    __syncthreads();
  }
  const double mean = red[0] / double(p.H);
  __syncthreads();
  double v = 0;
  for (int64_t i = threadIdx.x; i < p.H; i += blockDim.x) {
    const double d = double(bf(x[i])) - mean;
    v += d * d;
  }
  red[threadIdx.x] = v;
  __syncthreads();
  for (int o = 128; o > 0; o /= 2) {
    if (threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
    __syncthreads();
  }
  const float r = float(1.0 / sqrt(red[0] / double(p.H) + double(p.eps)));
  const float m = float(mean);
  uint16_t* o = p.out + blockIdx.x * p.os;
  for (int64_t i = threadIdx.x; i < p.H; i += blockDim.x)
    o[i] = to_bf(__fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(bf(x[i]), m), r), bf(p.w[i])), bf(p.b[i])));
}

struct MapParams {
  const uint16_t* x;     // [M, N], row stride xs
  const uint16_t* bias;  // [N] (bias add only)
  uint16_t* out;         // [M, N], row stride os
  int64_t xs, os, M, N;
  int mode;  // 0 gelu erf, 1 gelu tanh, 2 bias add
};

// Grid-stride over M * N elements, one per thread: GELU (fp32 math, one rounding) or out = bf16(x + bias).
__global__ void map_kernel(const __grid_constant__ MapParams p) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < p.M * p.N;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t m = i / p.N, n = i % p.N;
    const float v = bf(p.x[m * p.xs + n]);
    float y;
    if (p.mode == 0) {
      y = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    } else if (p.mode == 1) {
      y = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    } else {
      y = __fadd_rn(v, bf(p.bias[n]));
    }
    p.out[m * p.os + n] = to_bf(y);
  }
}

struct Rope2dParams {
  uint16_t* qkv;       // [T, 3 * Hn * D], row stride qs
  const int32_t* pos;  // [T, 2]
  const float* table;  // [P, D / 2], row stride ts: cos at j, sin at D / 4 + j
  int64_t qs, ts, T, Hn, D;
};

// Grid-stride over T * 2Hn * D/2 rotation pairs (q heads then k heads); each thread rotates one pair (i,
// i + D/2) with fp32 products and one add, no fma (__fmul_rn / __fadd_rn), as the CPU reference.
__global__ void rope_2d_kernel(const __grid_constant__ Rope2dParams p) {
  const int64_t half = p.D / 2, Q = p.D / 4, per_row = 2 * p.Hn * half;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < p.T * per_row;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / per_row, h = (e % per_row) / half, i = e % half;
    const int64_t axis = i < Q ? 0 : 1, j = i < Q ? i : i - Q;
    const float* row = p.table + int64_t(p.pos[2 * t + axis]) * p.ts;
    const float c = row[j], s = row[Q + j];
    uint16_t* x = p.qkv + t * p.qs + h * p.D;
    const float a = bf(x[i]), b = bf(x[i + half]);
    x[i] = to_bf(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    x[i + half] = to_bf(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
  }
}

// Grid: (ceil(T / 64), Hn); block 64: one query row per thread, over every key of its segment (found by a
// binary search of cu), online softmax in fp32, acc[D] in registers; neighbouring threads read the same keys,
// so the loads broadcast through L1. One rounding to bf16 at the end.
template <int D>
__global__ void __launch_bounds__(64)
    varlen_attention_kernel(const __grid_constant__ kc::VarlenAttnParams p) {
  const int64_t t = int64_t(blockIdx.x) * 64 + threadIdx.x, h = blockIdx.y;
  if (t >= p.T) return;
  int32_t lo = 0, hi = p.S;  // the segment s with cu[s] <= t < cu[s + 1]
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (p.cu[mid] <= t)
      lo = mid;
    else
      hi = mid;
  }
  const int32_t b = p.cu[lo], e = p.cu[lo + 1];
  float q[D], acc[D];
#pragma unroll
  for (int d = 0; d < D; ++d) {
    q[d] = bf(p.q[t * p.qs + h * p.qh + d]);
    acc[d] = 0.0f;
  }
  float mx = -FLT_MAX, l = 0.0f;
  for (int32_t j = b; j < e; ++j) {
    const uint16_t* kr = p.k + int64_t(j) * p.ks + h * p.kh;
    float s = 0.0f;
#pragma unroll
    for (int d = 0; d < D; ++d) s = fmaf(q[d], bf(kr[d]), s);
    s *= p.scale;
    const float m2 = fmaxf(mx, s), corr = __expf(mx - m2), pj = __expf(s - m2);
    l = l * corr + pj;
    const uint16_t* vr = p.v + int64_t(j) * p.vs + h * p.vh;
#pragma unroll
    for (int d = 0; d < D; ++d) acc[d] = acc[d] * corr + pj * bf(vr[d]);
    mx = m2;
  }
  uint16_t* o = p.out + t * p.os + h * p.oh;
#pragma unroll
  for (int d = 0; d < D; ++d) o[d] = to_bf(acc[d] / l);
}

// kiln's own rounding (kiln/dtype.h, the CPU reference's): NaN handling included, bitwise the host's.
__device__ __forceinline__ float round_bf(float f) {
  return ::kiln::bf16_to_f32(::kiln::f32_to_bf16(f));
}

struct PosEmbedParams {
  const uint16_t* table;  // [side * side, C]
  const float* lin;       // [H + W]: the row linspace, then the column one
  uint16_t* out;          // [T * H * W, C], row stride os
  int64_t os, C, side, T, H, W, m;
};

// Grid: (H * W): one patch q of frame 0 in merge-block order per block; block 128 strides over the channels
// and stores each value into every frame's row (t * H * W + q). The arithmetic of ops/vision_pos_embed.h
// with each fp32 operation correctly rounded and unfused (__fsub_rn, __fmul_rn, __fadd_rn) and each rounding
// point through kiln::f32_to_bf16: bitwise the CPU reference.
__global__ void pos_embed_kernel(const __grid_constant__ PosEmbedParams p) {
  const int64_t q = blockIdx.x, mm = p.m * p.m, blk = q / mm, in = q % mm, wb = p.W / p.m;
  const int64_t i = (blk / wb) * p.m + in / p.m, j = (blk % wb) * p.m + in % p.m;
  // floor corner (clamped into the table: a bad lin value never reads outside it), ceil corner, fraction.
  auto axis = [&](float v, int64_t& lo, int64_t& hi) {
    lo = int64_t(v);
    lo = lo < 0 ? 0 : (lo > p.side - 1 ? p.side - 1 : lo);
    hi = lo + 1 < p.side - 1 ? lo + 1 : p.side - 1;
    return __fsub_rn(v, float(lo));
  };
  int64_t fh, ch, fw, cw;
  const float dh = axis(p.lin[i], fh, ch), dw = axis(p.lin[p.H + j], fw, cw);
  const float uh = __fsub_rn(1.0f, dh), uw = __fsub_rn(1.0f, dw);
  const float wt[4] = {round_bf(__fmul_rn(uh, uw)), round_bf(__fmul_rn(uh, dw)), round_bf(__fmul_rn(dh, uw)),
                       round_bf(__fmul_rn(dh, dw))};
  const uint16_t* e[4] = {p.table + (fh * p.side + fw) * p.C, p.table + (fh * p.side + cw) * p.C,
                          p.table + (ch * p.side + fw) * p.C, p.table + (ch * p.side + cw) * p.C};
  const int64_t frame = p.H * p.W * p.os;
  for (int64_t c = threadIdx.x; c < p.C; c += blockDim.x) {
    float acc = round_bf(__fmul_rn(bf(e[0][c]), wt[0]));
#pragma unroll
    for (int k = 1; k < 4; ++k) acc = round_bf(__fadd_rn(acc, round_bf(__fmul_rn(bf(e[k][c]), wt[k]))));
    const uint16_t y = ::kiln::f32_to_bf16(acc).bits;
    uint16_t* o = p.out + q * p.os + c;
    for (int64_t t = 0; t < p.T; ++t) o[t * frame] = y;
  }
}

struct CastParams {
  const float* in;  // [M, K], row stride is
  uint16_t* out;    // [M, K], row stride os
  int64_t is, os, M, K;
};

// Grid-stride over M * K elements: out = kiln::f32_to_bf16(in), the host's conversion.
__global__ void cast_to_bf16_kernel(const __grid_constant__ CastParams p) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < p.M * p.K;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / p.K, c = e % p.K;
    p.out[r * p.os + c] = ::kiln::f32_to_bf16(p.in[r * p.is + c]).bits;
  }
}

}  // namespace

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, const Tensor& out) {
  if (x.shape[0] == 0) return;
  const LayerNormParams p{.x = x.ptr<uint16_t>(),
                          .w = weight.ptr<uint16_t>(),
                          .b = bias.ptr<uint16_t>(),
                          .out = out.ptr<uint16_t>(),
                          .xs = x.stride[0],
                          .os = out.stride[0],
                          .H = x.shape[1],
                          .eps = eps};
  kc::launch({.grid = dim3(unsigned(x.shape[0])), .block = dim3(256), .stream = kc::current_stream()},
             layer_norm_kernel, p);
}

void gelu(const Tensor& x, const Tensor& out, bool tanh_approx) {
  const int64_t n = x.shape[0] * x.shape[1];
  if (n == 0) return;
  const MapParams p{.x = x.ptr<uint16_t>(),
                    .bias = nullptr,
                    .out = out.ptr<uint16_t>(),
                    .xs = x.stride[0],
                    .os = out.stride[0],
                    .M = x.shape[0],
                    .N = x.shape[1],
                    .mode = tanh_approx ? 1 : 0};
  kc::launch({.grid = dim3(blocks_for(n, 256)), .block = dim3(256), .stream = kc::current_stream()},
             map_kernel, p);
}

void linear_bias(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  linear(x, weight, out);
  const int64_t n = out.shape[0] * out.shape[1];
  if (n == 0) return;
  const MapParams p{.x = out.ptr<uint16_t>(),
                    .bias = bias.ptr<uint16_t>(),
                    .out = out.ptr<uint16_t>(),
                    .xs = out.stride[0],
                    .os = out.stride[0],
                    .M = out.shape[0],
                    .N = out.shape[1],
                    .mode = 2};
  kc::launch({.grid = dim3(blocks_for(n, 256)), .block = dim3(256), .stream = kc::current_stream()},
             map_kernel, p);
}

void rope_2d(const Tensor& qkv, const Tensor& pos, const Tensor& table, int num_heads) {
  const int64_t D = table.shape[1] * 2, T = qkv.shape[0];
  const int64_t n = T * 2 * num_heads * (D / 2);
  if (n == 0) return;
  const Rope2dParams p{.qkv = qkv.ptr<uint16_t>(),
                       .pos = pos.ptr<int32_t>(),
                       .table = table.ptr<float>(),
                       .qs = qkv.stride[0],
                       .ts = table.stride[0],
                       .T = T,
                       .Hn = num_heads,
                       .D = D};
  kc::launch({.grid = dim3(blocks_for(n, 256)), .block = dim3(256), .stream = kc::current_stream()},
             rope_2d_kernel, p);
}

void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                      const Tensor& out, float scale) {
  const kc::VarlenAttnParams p{.q = q.ptr<uint16_t>(),
                               .k = k.ptr<uint16_t>(),
                               .v = v.ptr<uint16_t>(),
                               .cu = cu_seqlens.ptr<int32_t>(),
                               .out = out.ptr<uint16_t>(),
                               .qs = q.stride[0],
                               .qh = q.stride[1],
                               .ks = k.stride[0],
                               .kh = k.stride[1],
                               .vs = v.stride[0],
                               .vh = v.stride[1],
                               .os = out.stride[0],
                               .oh = out.stride[1],
                               .T = q.shape[0],
                               .Hn = q.shape[1],
                               .S = int32_t(cu_seqlens.shape[0] - 1),
                               .D = int32_t(q.shape[2]),
                               .scale = scale};
  // The tensor-core kernel (vision_attention.cu) for D 64 and 128 on aligned rows, else the SIMT one.
  kc::launch_varlen_attention(p, kc::current_stream());
}

void pos_embed_interpolate(const Tensor& table, const Tensor& lin, int64_t side, int64_t grid_t,
                           int64_t grid_h, int64_t grid_w, int64_t merge, const Tensor& out) {
  KILN_CHECK(grid_h * grid_w < (int64_t(1) << 31), "pos_embed_interpolate: grid ", grid_h, " x ", grid_w,
             " too large for one launch");
  const PosEmbedParams p{.table = table.ptr<uint16_t>(),
                         .lin = lin.ptr<float>(),
                         .out = out.ptr<uint16_t>(),
                         .os = out.stride[0],
                         .C = table.shape[1],
                         .side = side,
                         .T = grid_t,
                         .H = grid_h,
                         .W = grid_w,
                         .m = merge};
  kc::launch({.grid = dim3(unsigned(grid_h * grid_w)), .block = dim3(128), .stream = kc::current_stream()},
             pos_embed_kernel, p);
}

void cast_to_bf16(const Tensor& in, const Tensor& out) {
  const CastParams p{.in = in.ptr<float>(),
                     .out = out.ptr<uint16_t>(),
                     .is = in.stride[0],
                     .os = out.stride[0],
                     .M = in.shape[0],
                     .K = in.shape[1]};
  kc::launch({.grid = dim3(blocks_for(p.M * p.K, 256)), .block = dim3(256), .stream = kc::current_stream()},
             cast_to_bf16_kernel, p);
}

}  // namespace kiln::ops::cuda

namespace kiln::cuda {

void launch_varlen_attention_simt(const VarlenAttnParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  const LaunchCfg cfg{
      .grid = dim3(unsigned((p.T + 63) / 64), unsigned(p.Hn)), .block = dim3(64), .stream = stream};
  namespace oc = ::kiln::ops::cuda;
  switch (p.D) {
    case 16:
      return launch(cfg, oc::varlen_attention_kernel<16>, p);
    case 32:
      return launch(cfg, oc::varlen_attention_kernel<32>, p);
    case 64:
      return launch(cfg, oc::varlen_attention_kernel<64>, p);
    case 72:
      return launch(cfg, oc::varlen_attention_kernel<72>, p);
    case 80:
      return launch(cfg, oc::varlen_attention_kernel<80>, p);
    case 128:
      return launch(cfg, oc::varlen_attention_kernel<128>, p);
    default:
      KILN_FAIL("varlen_attention: unsupported head_dim ", p.D, " on CUDA (16, 32, 64, 72, 80, 128)");
  }
}

}  // namespace kiln::cuda
