// fp8_act_producers.h: SiLU-and-multiply and (add +) RMSNorm writing the W8A8 GEMM's quantized workspace.
#include "ops/cuda/fp8_act_producers.h"

#include <cuda_runtime.h>

#include "ops/cuda/common.cuh"
#include "ops/cuda/fp8_act_quant.cuh"
#include "ops/cuda/fp8_gemm.h"
#include "ops/cuda/norm_row.cuh"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace {

constexpr int kGroup = 128;           // activation group along K (ops::kFp8Block)
constexpr int kSiluRowsPerBlock = 8;  // one warp a row, as fp8_gemm.cu's quantizer
constexpr int kNormRowsPerBlock = 4;  // one warp a row, as elementwise.cu's rms_norm kernel

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

struct SiluQuantParams {
  const uint16_t* gate_up;  // bf16 [m, 2i], row stride ld
  uint8_t* q;               // e4m3 [m, i], row stride i (the workspace's codes)
  float* xs;                // f32 [ceil(i / 128), m_pad] (the workspace's scales)
  int64_t ld;
  int m, i, m_pad;
};

// Mapping: fp8_gemm.cu's quantize_act_kernel with the load replaced by the SiLU-and-multiply. Grid (m_pad /
// 8, ceil(i / 256)), block 256 = 8 warps; warp w owns row blockIdx.x * 8 + w and columns blockIdx.y * 256 ..
// + 255, two groups of 128, one a half-warp; lane l: the 8 columns at 256 blockIdx.y + 8 l (one 16-byte gate
// load, one up load; i % 16 == 0, so a lane's columns are all in or all past i), act = silu_mul_kernel's
// pack8(silu_mul_f32(g, u)), then quantize_act8 (the whole warp). Writes 8 codes a lane and one scale a
// half-warp; rows m .. m_pad - 1 write scale 0 only.
__global__ void __launch_bounds__(256) silu_mul_quant_kernel(const __grid_constant__ SiluQuantParams p) {
  pdl_launch_dependents();  // the GEMM may start its prologue; it waits for this grid before reading
  pdl_wait();               // a no-op unless launched with PDL
  const int lane = int(threadIdx.x % 32), row = int(blockIdx.x) * kSiluRowsPerBlock + int(threadIdx.x / 32);
  const int col = int(blockIdx.y) * 256 + lane * 8, kb = col / kGroup;
  const bool in = col < p.i;
  if (row >= p.m_pad) return;
  if (row >= p.m) {
    if (in && lane % 16 == 0) p.xs[int64_t(kb) * p.m_pad + row] = 0.0f;
    return;
  }
  uint4 act = make_uint4(0, 0, 0, 0);
  if (in) {
    const uint16_t* r = p.gate_up + int64_t(row) * p.ld;
    float g[8], u[8], y[8];
    unpack8(__ldg(reinterpret_cast<const uint4*>(r + col)), g);
    unpack8(__ldg(reinterpret_cast<const uint4*>(r + p.i + col)), u);
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = silu_mul_f32(g[j], u[j]);
    act = pack8(y);
  }
  const ActQuant8 a = quantize_act8(act);  // the whole warp: the half-warp butterfly
  if (!in) return;
  *reinterpret_cast<uint2*>(p.q + int64_t(row) * p.i + col) = a.codes;
  if (lane % 16 == 0) p.xs[int64_t(kb) * p.m_pad + row] = a.scale;
}

struct NormQuantParams {
  const uint16_t* x;   // bf16 [m, k], row stride ldx
  uint16_t* residual;  // bf16 [m, k], row stride ldr (add only)
  const uint4* w;      // bf16 [k / 8 chunks]
  uint16_t* out;       // bf16 [m, k], row stride ldo, or null (not stored)
  uint8_t* q;          // e4m3 [m, k], row stride k (the workspace's codes)
  float* xs;           // f32 [ceil(k / 128), m_pad] (the workspace's scales)
  int64_t ldx, ldr, ldo;
  int64_t m, k8;
  int m_pad;
  float eps;
  bool add;
};

// One chunk c (8 columns at 8 c) of a row's normed values y: stored where out is given, quantized by the
// half-warp of its 128-column group. Every lane of the warp calls it with the same chunk round (lanes past
// k pass zeros, which do not move the amax).
__device__ __forceinline__ void emit_chunk(const NormQuantParams& p, int64_t row, int64_t c, const uint4& y,
                                           int lane) {
  const bool in = c < p.k8;
  if (in && p.out) reinterpret_cast<uint4*>(p.out + row * p.ldo)[c] = y;
  const ActQuant8 a = quantize_act8(y);
  if (!in) return;
  *reinterpret_cast<uint2*>(p.q + row * p.k8 * 8 + c * 8) = a.codes;
  if (lane % 16 == 0) p.xs[(c * 8 / kGroup) * p.m_pad + row] = a.scale;
}

// Mapping: grid (m_pad / 4), block 4 warps, one row a warp, as elementwise.cu's rms_norm kernel: lane l owns
// chunks l, l + 32, ... (16-byte loads), sums its squares in that order (norm_row.cuh's helpers), the xor
// butterfly gives inv; round i's 32 chunks are columns 256 i .. 256 i + 255, lanes 0-15 one 128-group and
// lanes 16-31 the next: quantize_act8's half-warp layout. Rows of up to 32 * kNormRegChunks chunks stay in
// registers; longer ones take a second pass re-reading r (this lane's own writes or x). Rows m .. m_pad - 1
// write their scales 0. Writes residual (add), out (when given), the codes and the scales.
__global__ void __launch_bounds__(kNormRowsPerBlock * 32)
    rms_norm_quant_kernel(const __grid_constant__ NormQuantParams p) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t row = int64_t(blockIdx.x) * kNormRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (row >= p.m_pad) return;
  if (row >= p.m) {
    for (int64_t kb = lane; kb < (p.k8 * 8 + kGroup - 1) / kGroup; kb += 32) p.xs[kb * p.m_pad + row] = 0.0f;
    return;
  }
  const uint4* x = reinterpret_cast<const uint4*>(p.x + row * p.ldx);
  uint4* res = reinterpret_cast<uint4*>(p.residual + (p.add ? row * p.ldr : 0));
  const int64_t H8 = p.k8;
  float acc = 0.0f;
  if (H8 <= 32 * kNormRegChunks) {
    uint4 xv[kNormRegChunks], rv[kNormRegChunks], wr[kNormRegChunks];
#pragma unroll
    for (int i = 0; i < kNormRegChunks; ++i) {
      const int64_t c = lane + 32 * i;
      if (c < H8) {
        xv[i] = x[c];
        wr[i] = p.w[c];
        if (p.add) rv[i] = res[c];
      }
    }
#pragma unroll
    for (int i = 0; i < kNormRegChunks; ++i) {
      const int64_t c = lane + 32 * i;
      if (c < H8) {
        if (p.add) {
          xv[i] = norm_add_chunk(xv[i], rv[i]);
          res[c] = xv[i];
        }
        norm_square_chunk(xv[i], acc);
      }
    }
    const float inv = norm_inv_rms(acc, H8, p.eps);
#pragma unroll
    for (int i = 0; i < kNormRegChunks; ++i) {
      if (32 * i >= H8) break;  // warp-uniform: the butterfly in emit_chunk sees the whole warp
      const int64_t c = lane + 32 * i;
      const uint4 y = c < H8 ? norm_scale_chunk(xv[i], wr[i], inv) : make_uint4(0, 0, 0, 0);
      emit_chunk(p, row, c, y, lane);
    }
    return;
  }
  for (int64_t base = 0; base < H8; base += 32) {
    const int64_t c = base + lane;
    if (c >= H8) continue;
    uint4 v = x[c];
    if (p.add) {
      v = norm_add_chunk(v, res[c]);
      res[c] = v;
    }
    norm_square_chunk(v, acc);
  }
  const float inv = norm_inv_rms(acc, H8, p.eps);
  for (int64_t base = 0; base < H8; base += 32) {
    const int64_t c = base + lane;
    const uint4 y = c < H8 ? norm_scale_chunk(p.add ? res[c] : x[c], p.w[c], inv) : make_uint4(0, 0, 0, 0);
    emit_chunk(p, row, c, y, lane);
  }
}

// The checks both launchers share: fp8_quantize_act's, for a producer of m rows of k.
void check_workspace(const char* op, int64_t m, int64_t k, const void* workspace, int64_t workspace_bytes) {
  KILN_CHECK(m >= 1 && k >= 16 && k % 16 == 0 && m < (int64_t(1) << 30) && k < (int64_t(1) << 24), op,
             ": M = ", m, ", K = ", k, " (1 <= M < 2^30; K a multiple of 16, 16 <= K < 2^24)");
  KILN_CHECK(workspace && reinterpret_cast<uintptr_t>(workspace) % 256 == 0, op,
             ": the workspace must be 256-byte aligned");
  KILN_CHECK(workspace_bytes >= fp8_gemm_workspace_bytes(m, k), op, ": workspace of ", workspace_bytes,
             " bytes, ", fp8_gemm_workspace_bytes(m, k), " needed for M = ", m, ", K = ", k);
}

}  // namespace

void silu_mul_quantize_act(const void* gate_up, int64_t ld, int64_t m, int64_t i, void* workspace,
                           int64_t workspace_bytes, cudaStream_t stream) {
  check_workspace("silu_mul_quantize_act", m, i, workspace, workspace_bytes);
  KILN_CHECK(ld >= 2 * i && ld % 8 == 0 && aligned16(gate_up), "silu_mul_quantize_act: gate_up row stride ",
             ld, " (>= 2 I = ", 2 * i, ", a multiple of 8) and 16-byte alignment");
  const int64_t m_pad = fp8_act_scale_rows(m);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  const SiluQuantParams p{.gate_up = static_cast<const uint16_t*>(gate_up),
                          .q = ws,
                          .xs = reinterpret_cast<float*>(ws + fp8_act_scale_offset(m, i)),
                          .ld = ld,
                          .m = int(m),
                          .i = int(i),
                          .m_pad = int(m_pad)};
  launch({.grid = dim3(unsigned(m_pad / kSiluRowsPerBlock), unsigned((i + 255) / 256)),
          .block = dim3(256),
          .stream = stream},
         silu_mul_quant_kernel, p);
}

void rms_norm_quantize_act(const void* x, int64_t ldx, void* residual, int64_t ldr, const void* w, void* out,
                           int64_t ldo, int64_t m, int64_t k, float eps, bool add, void* workspace,
                           int64_t workspace_bytes, cudaStream_t stream) {
  check_workspace("rms_norm_quantize_act", m, k, workspace, workspace_bytes);
  KILN_CHECK(ldx >= k && ldx % 8 == 0 && (!add || (ldr >= k && ldr % 8 == 0)) &&
                 (!out || (ldo >= k && ldo % 8 == 0)),
             "rms_norm_quantize_act: row strides must be >= K = ", k, " and multiples of 8");
  KILN_CHECK(aligned16(x) && aligned16(w) && (!add || (residual && aligned16(residual))) && aligned16(out),
             "rms_norm_quantize_act: x, w, residual (add) and out must be 16-byte aligned");
  KILN_CHECK(eps >= 0.0f, "rms_norm_quantize_act: eps must be >= 0");
  const int64_t m_pad = fp8_act_scale_rows(m);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  const NormQuantParams p{.x = static_cast<const uint16_t*>(x),
                          .residual = static_cast<uint16_t*>(residual),
                          .w = static_cast<const uint4*>(w),
                          .out = static_cast<uint16_t*>(out),
                          .q = ws,
                          .xs = reinterpret_cast<float*>(ws + fp8_act_scale_offset(m, k)),
                          .ldx = ldx,
                          .ldr = ldr,
                          .ldo = ldo,
                          .m = m,
                          .k8 = k / 8,
                          .m_pad = int(m_pad),
                          .eps = eps,
                          .add = add};
  launch({.grid = dim3(unsigned(m_pad / kNormRowsPerBlock)),
          .block = dim3(kNormRowsPerBlock * 32),
          .stream = stream},
         rms_norm_quant_kernel, p);
}

}  // namespace kiln::cuda
