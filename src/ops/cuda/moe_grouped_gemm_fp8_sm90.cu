// Block-FP8 experts as a W8A8 grouped GEMM on Hopper (sm_90a; moe.h step 4, MoeExpertKernel::
// grouped_gemm_fp8_sm90): path (a) of ops/fp8_linear.h, the checkpoint's own semantics and the CPU oracle's
// (ops::moe_mlp with block-FP8 experts), in place of dequantizing the chosen experts to bf16 first.
//
// One projection is two launches, gate_up then down (four in all, on one stream, no host synchronisation):
//   1. quantize_rows_kernel: the projection's input rows in sorted order (gate_up: the x row of each sorted
//      row's token, zeros on padding rows; down: the act rows) quantized per row and 128-group into
//      MoeBuffers::act_q / act_qs by fp8_act_quant.cuh's quantize_act8 (bitwise ops::quantize_act_fp8). The
//      sorted order makes each 64-row tile's A rows contiguous, so the GEMM reads them by plain 2-D TMA boxes
//      (the BF16 grouped kernel gathers x rows by cp.async instead). Quantizing the k copies of a token's x
//      row, rather than T rows once and gathering, costs ~k x the quantizer's arithmetic (30B-A3B, T = 1024:
//      16 MB of e4m3 written) but no gather launch and no per-row loads in the GEMM.
//   2. w8a8_kernel: the e4m3 x e4m3 grouped GEMM, fp8_gemm_sm90.cuh's structure (its issue_block: four
//      wgmma m64n128k32 e4m3 over a 128-wide K block) on the MoE's 64-row tiles.
// Numerics: the quantizer is the oracle's; the products differ from the oracle's by the tensor cores'
// summation order inside a K block and the fma of the promotion (fp8_gemm.h's tolerance), then the rounding
// points of the BF16 kernels (gate and up rounded to bf16, silu_mul_f32, act bf16; y bf16).
#include <cuda.h>

#include "ops/cuda/common.cuh"
#include "ops/cuda/device_flag.h"
#include "ops/cuda/fp8_act_quant.cuh"
#include "ops/cuda/fp8_gemm_sm90.cuh"  // issue_block, kBK
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/sm90.cuh"
#include "ops/cuda/sm90_copy.cuh"
#include "ops/cuda/tensor_map.h"
#include "ops/cuda/vec.cuh"

namespace kiln::cuda {
namespace {

constexpr int kBM = kMoeRowTile;         // 64 sorted rows, one expert's
constexpr int kBK = fp8_gemm_sm90::kBK;  // 128: one K block, one 128-byte swizzled e4m3 row, one scale
constexpr int kWgN = 128;                // weight rows of one consumer warpgroup (wgmma n)
constexpr int kBN = 2 * kWgN;            // weight rows of a tile: 2 consumers
constexpr int kStages = 5;
constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kQuantRowsPerBlock = 8;

// Shared memory (offsets from the 1024-aligned base): A [S][64 rows][128 B], B [S][256 rows][128 B] (consumer
// c's rows 128 c .. 128 c + 127), the A rows' scales [S][64] f32, full[S], empty[S].
struct Layout {
  static constexpr uint32_t a_bytes = kBM * kBK, b_bytes = kBN * kBK, sa_bytes = kBM * 4;
  static constexpr uint32_t a_off = 0, b_off = kStages * a_bytes, sa_off = b_off + kStages * b_bytes;
  static constexpr uint32_t bar_off = sa_off + kStages * sa_bytes;
  static constexpr uint32_t alloc = bar_off + 2 * kStages * 8 + 1024;  // aligned up to 1024 by hand
  static constexpr uint32_t stage_tx = a_bytes + b_bytes + sa_bytes;
  static_assert(b_off % 1024 == 0 && b_bytes % 1024 == 0 && alloc <= 227 * 1024, "stages exceed smem");
  // Also what keeps an sm_80 build of this unit (whose kernel bodies are empty) from finding them unused.
  static_assert(a_off % 1024 == 0, "128-byte swizzled TMA tiles need 1024-byte aligned stages");
  static_assert(stage_tx < (1u << 20), "an mbarrier's transaction count has 20 bits");
};

struct W8a8Params {
  CUtensorMap tmap_a;          // act_q e4m3 [m_pad, K], box {128 K, 64 rows}
  CUtensorMap tmap_b;          // w8 e4m3 [L, N_w, K], box {128 K, 64 rows, 1 expert}
  const float* a_scale;        // act_qs f32 [K / 128][m_pad]
  const float* w_scale;        // f32 [L, N_w / 128, K / 128]
  uint16_t* out;               // bf16 [m_pad, N] contiguous (act or y)
  const int32_t* tile_expert;  // i32 [max_tiles]
  const int32_t* num_tiles;    // i32 [1]
  int N;                       // output columns: I (gate_up; N_w = 2I) or H (down; N_w = H)
  int kblocks;                 // K / 128
  int m_pad;                   // max_rows
  int n_blocks;                // column blocks a tile: I / 128 (gate_up) or ceil(H / 256) (down)
  int n_scale_rows;            // N_w / 128
  int expert_begin;
};

// Mapping: grid (m_pad / 8, ceil(K / 256)), block 256 threads = 8 warps; warp w owns sorted row
// blockIdx.x * 8 + w and columns blockIdx.y * 256 .. + 255 (two 128-groups, one a half-warp); lane l the 8
// bf16 at column 256 blockIdx.y + 8 l (one 16-byte load; K % 128 == 0, so a lane's 8 are all in or all past
// K). Rows of tiles past *num_tiles return at once (the GEMM reads none); padding rows (no source row:
// moe_a_row nullptr) quantize zeros (codes 0, a_s = 1e-10 / 448). quantize_act8 as fp8_gemm.cu's quantizer
// calls it: the codes and a_s of ops::quantize_act_fp8, bitwise. Writes 8 code bytes a lane into q[row * K +
// col] and one scale a half-warp into qs[kb * m_pad + row].
template <bool kSilu>
__global__ void __launch_bounds__(256)
    quantize_rows_kernel(const __grid_constant__ MoeProductParams p, uint8_t* __restrict__ q,
                         float* __restrict__ qs, int m_pad) {
  const int lane = int(threadIdx.x % 32), row = int(blockIdx.x) * kQuantRowsPerBlock + int(threadIdx.x / 32);
  if (row >= *p.num_tiles * kBM) return;  // warp-uniform
  const int col = int(blockIdx.y) * 256 + lane * 8, kb = col / kBK;
  const bool in = col < p.K;
  const uint16_t* src = moe_a_row<kSilu>(p, row);
  uint4 raw = make_uint4(0, 0, 0, 0);
  if (in && src) raw = __ldg(reinterpret_cast<const uint4*>(src + col));
  const ActQuant8 a = quantize_act8(raw);  // the whole warp: the half-warp butterfly
  if (!in) return;
  *reinterpret_cast<uint2*>(q + int64_t(row) * p.K + col) = a.codes;
  if (lane % 16 == 0) qs[int64_t(kb) * m_pad + row] = a.scale;
}

#ifdef KILN_SM90A

// Unit u of the persistent walk: tile u / n_blocks (its 64 sorted rows, one expert's), column block
// u % n_blocks; column blocks fastest, so the blocks in flight share A tiles and experts' weights in L2.
__device__ __forceinline__ void unit_of(const W8a8Params& p, int u, int& tile, int& nb) {
  tile = u / p.n_blocks;
  nb = u - tile * p.n_blocks;
}

// The weight rows (of the expert's N_w) of B box q (0..3: consumer q / 2, half q % 2, 64 rows each).
// gate_up: consumer c's gate rows 128 nb + 64 c + [0, 64), then the matching up rows (+ I); down: output
// rows 256 nb + 128 c + 64 h + [0, 64) (past H: zero-filled by the tensor map's N_w bound).
template <bool kSilu>
__device__ __forceinline__ int b_box_row(const W8a8Params& p, int nb, int q) {
  const int c = q / 2, h = q % 2;
  if constexpr (kSilu)
    return kWgN * nb + 64 * c + (h ? p.N : 0);
  else
    return kBN * nb + kWgN * c + 64 * h;
}

template <bool kSilu>
__device__ __forceinline__ void produce(const W8a8Params& p, uint32_t base, int units) {
  const uint32_t full = base + Layout::bar_off, empty = full + 8 * kStages;
  int s = 0;
  uint32_t ph = 0;
  for (int u = int(blockIdx.x); u < units; u += int(gridDim.x)) {
    int tile, nb;
    unit_of(p, u, tile, nb);
    const int e = p.tile_expert[tile] - p.expert_begin, row0 = tile * kBM;
    for (int kb = 0; kb < p.kblocks; ++kb) {
      const uint32_t fb = full + 8 * s, sb = base + Layout::b_off + uint32_t(s) * Layout::b_bytes;
      sm90::mbar_wait(empty + 8 * s, ph ^ 1u);
      sm90::mbar_arrive_expect_tx(fb, Layout::stage_tx);
      sm90::tma_load_2d(base + Layout::a_off + uint32_t(s) * Layout::a_bytes, &p.tmap_a, kb * kBK, row0, fb);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        sm90::tma_load_3d(sb + uint32_t(q) * (64 * kBK), &p.tmap_b, kb * kBK, b_box_row<kSilu>(p, nb, q), e,
                          fb);
      sm90::bulk_load(base + Layout::sa_off + uint32_t(s) * Layout::sa_bytes,
                      p.a_scale + int64_t(kb) * p.m_pad + row0, Layout::sa_bytes, fb);
      if (++s == kStages) s = 0, ph ^= 1u;
    }
  }
}

// Consumer c (0, 1) of a unit: rows 0..63 of the tile (warp w rows 16 w .. + 15, thread rows lane / 4 and
// + 8), B rows 128 c .. + 127 of the stage; accumulator d[4 j + h]: row 16 w + lane / 4 + 8 (h / 2), column
// 8 j + 2 (lane % 4) + h % 2 of the consumer's 128 (wgmma_asm.cuh). Per K block as fp8_gemm_sm90.cuh's
// consume: P by issue_block, the rows' a_s from the stage, the stage released, acc = fma(P, a_s * w_s, acc).
// w_s: gate_up columns 0..63 (gate) take block row nb, 64..127 (up) row I / 128 + nb; down all 128 take row
// 2 nb + c (clamped past H: those columns are not stored).
template <bool kSilu>
__device__ __forceinline__ void consume(const W8a8Params& p, uint32_t base, const uint8_t* gbase, int c,
                                        int units) {
  const uint32_t full = base + Layout::bar_off, empty = full + 8 * kStages;
  const int t = int(threadIdx.x % 128), warp = t / 32, lane = t % 32;
  const int row = 16 * warp + lane / 4;  // this thread's first row in the tile (the other: + 8)
  float acc[kWgN / 2], part[kWgN / 2];
  int s = 0;
  uint32_t ph = 0;
  for (int u = int(blockIdx.x); u < units; u += int(gridDim.x)) {
    int tile, nb;
    unit_of(p, u, tile, nb);
    const int e = p.tile_expert[tile] - p.expert_begin;
    int r0, r1;  // weight-scale block rows of columns 0..63 and 64..127
    if constexpr (kSilu) {
      r0 = nb;
      r1 = p.N / kBK + nb;
    } else {
      r0 = r1 = min(2 * nb + c, p.n_scale_rows - 1);
    }
    const float* ws = p.w_scale + int64_t(e) * p.n_scale_rows * p.kblocks;
    const float* ws0 = ws + int64_t(r0) * p.kblocks;
    const float* ws1 = ws + int64_t(r1) * p.kblocks;
#pragma unroll
    for (int i = 0; i < kWgN / 2; ++i) acc[i] = 0.0f;
    float wn0 = __ldg(ws0), wn1 = __ldg(ws1);
    for (int kb = 0; kb < p.kblocks; ++kb) {
      const float w0 = wn0, w1 = wn1;
      if (kb + 1 < p.kblocks) {
        wn0 = __ldg(ws0 + kb + 1);
        wn1 = __ldg(ws1 + kb + 1);
      }
      sm90::mbar_wait(full + 8 * s, ph);
      __syncwarp();  // the spin may end on different iterations per lane; wgmma needs the warp converged
      sm90::fence_regs(part);
      sm90::wgmma_fence();
      fp8_gemm_sm90::issue_block<kWgN>(
          part, base + Layout::a_off + uint32_t(s) * Layout::a_bytes,
          base + Layout::b_off + uint32_t(s) * Layout::b_bytes + uint32_t(c) * (kWgN * kBK));
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(part);
      const float* sa =
          reinterpret_cast<const float*>(gbase + Layout::sa_off + uint32_t(s) * Layout::sa_bytes);
      const float a0 = sa[row], a1 = sa[row + 8];
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(empty + 8 * s);
      const float s00 = a0 * w0, s10 = a1 * w0, s01 = a0 * w1, s11 = a1 * w1;
#pragma unroll
      for (int i = 0; i < kWgN / 2; ++i) {
        const bool second = i / 4 >= 8;  // columns 64..127
        acc[i] = fmaf(part[i], (i & 2) ? (second ? s11 : s10) : (second ? s01 : s00), acc[i]);
      }
      if (++s == kStages) s = 0, ph ^= 1u;
    }
    // The epilogue from registers, the BF16 grouped kernel's: every row of the tile (padding rows hold 0).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = tile * kBM + row + 8 * half;
      uint16_t* orow = p.out + int64_t(r) * p.N;
#pragma unroll
      for (int j = 0; j < (kSilu ? 8 : 16); ++j) {
        const int col = kSilu ? kWgN * nb + 64 * c + 8 * j + 2 * (lane % 4)
                              : kBN * nb + kWgN * c + 8 * j + 2 * (lane % 4);
        float v[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float a = acc[4 * j + 2 * half + h];
          if constexpr (kSilu)
            v[h] = silu_mul_f32(round_bf16(a), round_bf16(acc[4 * (j + 8) + 2 * half + h]));
          else
            v[h] = a;
        }
        if (col < p.N)  // N % 128 == 0: a pair is all in or all out
          *reinterpret_cast<uint32_t*>(orow + col) = f32_to_bf16_bits(v[0]) | (f32_to_bf16_bits(v[1]) << 16);
      }
    }
  }
}

#endif  // KILN_SM90A

// Mapping: persistent, grid min(SMs, max_tiles x n_blocks) blocks, one an SM (~201 KB of shared memory);
// block 384 threads = 3 warpgroups. Units (tile, column block), tile < *num_tiles: block b takes units b, b +
// gridDim.x, ...; the stage counter (stage it % S, phase (it / S) & 1) runs on across a block's units, so
// the producer loads the next unit while the consumers store the last.
//   warpgroup 0, producer (setmaxnreg 40; thread 0 alone works): per unit and K block kb, waits for the
//     stage's release (empty barrier: the 8 consumer warps), announces its bytes on the full barrier, then
//     issues: the tile's 64 act_q rows x K kb*128 .. + 127 (one 2-D TMA box, 128-byte swizzle), the expert's
//     four 64-row weight boxes (b_box_row; 3-D map [L, N_w, K], rows past N_w zero-filled), and the 64 rows'
//     scales act_qs[kb, row0 .. + 63] (one 256-byte bulk copy).
//   warpgroups 1 and 2, consumers (setmaxnreg 232): consumer c, 128 weight rows against the tile's 64 rows
//     (consume above); gate_up: act[row, 128 nb + 64 c + j] = silu_mul_f32(round_bf16(gate), round_bf16(up))
//     in bf16, the gate and up columns of one accumulator (blocks j and j + 8); down: y[row, 256 nb + 128 c +
//     j] = bf16(acc) for columns < H.
template <bool kSilu>
__global__ void __launch_bounds__(kThreads, 1) w8a8_kernel(const __grid_constant__ W8a8Params p) {
#ifdef KILN_SM90A
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = sm90::smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  fp8_gemm_sm90::init_pipeline(base + Layout::bar_off, kStages, 8);
  __syncthreads();
  const int units = *p.num_tiles * p.n_blocks;  // the same value in every thread (written before launch)
  const int wg = int(threadIdx.x / 128);
  if (wg == 0) {
    sm90::setmaxnreg_dec<40>();
    if (threadIdx.x == 0) produce<kSilu>(p, base, units);
  } else {
    sm90::setmaxnreg_inc<232>();
    consume<kSilu>(p, base, smem_raw + (base - raw), wg - 1, units);
  }
#else
  (void)p;
#endif
}

PerDeviceFlag g_applies;

// A 2-D (act_q [rows, k]; experts 0) or 3-D (the experts' weights [experts, rows, k]) e4m3 map, boxes of 64
// rows x 128 bytes, 128-byte swizzle (tensor_map.h), as fp8_gemm.cu's.
CUtensorMap tensor_map(const void* base, int64_t k, int64_t rows, int64_t experts) {
  CUtensorMap m;
  const uint64_t dims[3] = {uint64_t(k), uint64_t(rows), uint64_t(experts)};
  const uint64_t strides[2] = {uint64_t(k), uint64_t(k * rows)};
  const uint32_t box[3] = {uint32_t(kBK), 64, 1};  // A: a tile's 64 rows; B: a quarter of a stage's rows
  KILN_CHECK(
      try_encode_tiled_map(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, experts > 0 ? 3 : 2, base, dims, strides, box),
      "moe W8A8 grouped GEMM: the driver refused a tensor map (K = ", k, ", rows = ", rows, ")");
  return m;
}

// One projection: its input rows quantized into the workspace, then the GEMM. N_w = 2N for gate_up.
template <bool kSilu>
void project(const MoeShape& s, const MoeProductParams& p, const MoeBuffers& b, cudaStream_t stream) {
  const int64_t m_pad = s.max_rows(), L = s.local_experts(), n_w = kSilu ? 2 * int64_t(p.N) : p.N;
  KILN_CHECK(p.w8 && p.ws && p.K % kBK == 0 && p.N % kBK == 0 && p.skb == p.K / kBK,
             "moe W8A8 grouped GEMM: block-FP8 experts with N and K multiples of 128, got N ", p.N, ", K ",
             p.K);
  const LaunchCfg qcfg{.grid = dim3(unsigned(m_pad / kQuantRowsPerBlock), unsigned((p.K + 255) / 256)),
                       .block = dim3(256),
                       .stream = stream};
  launch(qcfg, quantize_rows_kernel<kSilu>, p, b.act_q, b.act_qs, int(m_pad));

  W8a8Params g{};
  g.tmap_a = tensor_map(b.act_q, p.K, m_pad, 0);
  g.tmap_b = tensor_map(p.w8, p.K, n_w, L);
  g.a_scale = b.act_qs;
  g.w_scale = p.ws;
  g.out = p.out;
  g.tile_expert = p.tile_expert;
  g.num_tiles = p.num_tiles;
  g.N = p.N;
  g.kblocks = p.K / kBK;
  g.m_pad = int(m_pad);
  g.n_blocks = kSilu ? p.N / kWgN : (p.N + kBN - 1) / kBN;
  g.n_scale_rows = int(n_w / kBK);
  g.expert_begin = p.expert_begin;
  int dev = 0, sms = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t max_units = s.max_tiles() * g.n_blocks;
  KILN_CHECK(max_units < (int64_t(1) << 31), "moe W8A8 grouped GEMM: ", max_units, " units");
  const LaunchCfg cfg{.grid = dim3(unsigned(max_units < sms ? max_units : sms)),
                      .block = dim3(kThreads),
                      .smem = Layout::alloc,
                      .stream = stream,
                      .smem_attr_set = true};  // in moe_grouped_gemm_fp8_sm90_applies()
  launch(cfg, w8a8_kernel<kSilu>, g);
}

}  // namespace

bool moe_grouped_gemm_fp8_sm90_applies() {
  return g_applies.get([] {
    if (!current_device_is_sm90() || !tensor_maps_available()) return false;
    for (const void* k : {reinterpret_cast<const void*>(w8a8_kernel<true>),
                          reinterpret_cast<const void*>(w8a8_kernel<false>)}) {
      if (kernel_binary_version(k) != 90) return false;
      if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Layout::alloc)) !=
          cudaSuccess) {
        (void)cudaGetLastError();
        return false;
      }
    }
    return true;
  });
}

void moe_grouped_gemm_fp8_sm90_launch(const MoeShape& s, const MoeProductParams& gate_up,
                                      const MoeProductParams& down, const MoeBuffers& b,
                                      cudaStream_t stream) {
  KILN_CHECK(moe_grouped_gemm_fp8_sm90_applies(),
             "moe W8A8 grouped GEMM: needs an sm_90 device running sm_90a code and the driver's tensor maps");
  KILN_CHECK(s.fp8_w8a8 && b.act_q && b.act_qs,
             "moe W8A8 grouped GEMM: the scratch lacks its workspace "
             "(MoeShape::fp8_w8a8)");
  KILN_CHECK(s.max_rows() * (s.H > s.I ? s.H : s.I) < (int64_t(1) << 31),
             "moe W8A8 grouped GEMM: ", s.max_rows(), " rows of ", s.H > s.I ? s.H : s.I,
             " exceed 2^31 bytes");
  project<true>(s, gate_up, b, stream);
  project<false>(s, down, b, stream);
}

}  // namespace kiln::cuda
