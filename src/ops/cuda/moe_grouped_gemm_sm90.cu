// The experts as a grouped GEMM on Hopper's wgmma (sm_90a; moe.h step 4): the rows of a 64-row tile are
// gathered by cp.async into 128-byte-swizzled shared memory (a gather TMA cannot do: the x rows of a tile
// are scattered tokens), four stages deep, and two warpgroups each run m64n128k16 products from it. Tiles
// come from the device-side offsets (a grid sized for the worst case; a tile past the count exits).
#include "ops/cuda/common.cuh"
#include "ops/cuda/device_flag.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/sm90.cuh"
#include "ops/cuda/vec.cuh"
#include "ops/cuda/wgmma_bf16.cuh"

namespace kiln::cuda {
namespace {

constexpr int kBM = kMoeRowTile;  // 64 rows, one expert's
constexpr int kBN = 256;          // weight rows: 2 warpgroups x 128
constexpr int kBK = 64;           // k of a stage: one 128-byte swizzled row
constexpr int kStages = 4;
constexpr int kThreads = 256;                 // 2 warpgroups; every thread also issues loads
constexpr int kATile = kBM * 128;             // bytes of a stage's A tile
constexpr int kBTile = kBN * 128;             // bytes of a stage's B tile
constexpr int kStageBytes = kATile + kBTile;  // 40 KB
constexpr size_t kSmem = size_t(kStages) * kStageBytes + 1024;  // + alignment slack
// The tiles above hard-code a stage's k as one 128-byte swizzled row; this also keeps an sm_80 build of this
// unit (whose kernel bodies are empty) from finding kBK unused.
static_assert(kBK * sizeof(uint16_t) == 128, "a stage's k is one 128-byte swizzled row of bf16");

// Grid: (max_tiles, ceil(N / (kSilu ? 128 : 256))); block: 2 warpgroups. Block (tile, nb): the tile's 64
// sorted rows against 256 weight rows. SiLU: warpgroup g's 128 B rows are gate rows n0 + 64 g + [0, 64)
// then the matching up rows, so each thread holds gate and up of the same act column (accumulator blocks j
// and j + 8) and the epilogue is SiLU-and-multiply with the dense rounding points; else warpgroup g's are
// output columns n0 + 128 g + [0, 128). Loads: stage s of k [64 s, 64 s + 64): A's 64 rows x 8 chunks and
// B's 256 x 8, 16-byte cp.async into the swizzled layout (chunk c of row r at c ^ (r % 8)); rows or k past
// the ends, and padding rows (sorted_pair -1), are zero-filled. Writes every row of the tile.
template <bool kSilu>
__global__ void __launch_bounds__(kThreads)
    grouped_gemm_sm90_kernel(const __grid_constant__ MoeProductParams p) {
#ifdef KILN_SM90A
  const int tile = int(blockIdx.x);
  if (tile >= *p.num_tiles) return;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int e = p.tile_expert[tile];
  const int row0 = tile * kBM;
  const int n0 = int(blockIdx.y) * (kSilu ? 128 : kBN);
  const int tid = int(threadIdx.x), wg = tid / 128, warp_in_wg = (tid % 128) / 32, lane = tid % 32;
  const int64_t wrows = kSilu ? 2 * int64_t(p.N) : p.N;
  const uint16_t* we = p.w + int64_t(e - p.expert_begin) * wrows * p.K;  // EP: w from expert_begin

  // This thread's rows: A row tid / 8 + 32 i (i < 2), B row tid / 8 + 32 i (i < 8), chunk tid % 8.
  const int chunk = tid % 8;
  const uint16_t* a_src[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) a_src[i] = moe_a_row<kSilu>(p, row0 + tid / 8 + 32 * i);
  const uint16_t* b_src[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = tid / 8 + 32 * i;  // B row in the tile
    int n;
    bool ok;
    if constexpr (kSilu) {
      const int g = r / 128, q = r % 128;
      n = n0 + 64 * g + q % 64;
      ok = n < p.N;
      n += q < 64 ? 0 : p.N;
    } else {
      n = n0 + r;
      ok = n < p.N;
    }
    b_src[i] = ok ? we + int64_t(n) * p.K : nullptr;
  }
  const auto load_stage = [&](int kt) {
    uint8_t* st = smem + (kt % kStages) * kStageBytes;
    const int kk = kt * kBK + chunk * 8;
    const bool k_ok = kk < p.K;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = tid / 8 + 32 * i;
      uint8_t* dst = st + sm90::sw128_offset(r, chunk);
      if (a_src[i] && k_ok)
        cp_async16(dst, a_src[i] + kk);
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = tid / 8 + 32 * i;
      uint8_t* dst = st + kATile + sm90::sw128_offset(r, chunk);
      if (b_src[i] && k_ok)
        cp_async16(dst, b_src[i] + kk);
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  };

  float d[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) d[i] = 0.0f;
  const int nk = (p.K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) load_stage(s);
    cp_async_commit();
  }
  // Per stage: wait for its data and for the previous stage's products, one barrier, issue this stage's
  // products, then (while they run) the loads of stage kt + 3 into the buffer the previous products read.
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kStages - 2>();  // stage kt has landed (this thread's part)
    sm90::fence_proxy_async();     // ... visible to the wgmma (async proxy) reads
    sm90::wgmma_wait<0>();         // this warpgroup's products of stage kt - 1 are done
    __syncthreads();               // every thread's part of stage kt; every product of kt - 1 done
    const uint32_t st = sm90::smem_u32(smem + (kt % kStages) * kStageBytes);
    const sm90::WgmmaDesc da = sm90::sw128_desc(st, 16, 1024);
    const sm90::WgmmaDesc db = sm90::sw128_desc(st + kATile + uint32_t(wg) * 128 * 128, 16, 1024);
    sm90::wgmma_fence();
#pragma unroll
    for (int s = 0; s < kBK / 16; ++s) sm90::wgmma_m64n128k16_ss(d, da.plus(32 * s), db.plus(32 * s), 1);
    sm90::wgmma_commit();
    if (kt + kStages - 1 < nk) load_stage(kt + kStages - 1);  // buffer (kt - 1) % kStages: free (above)
    cp_async_commit();
  }
  sm90::wgmma_wait<0>();
  cp_async_wait<0>();

  // d[4 j + h]: row 16 w + lane / 4 + 8 (h / 2), column 8 j + 2 (lane % 4) + h % 2 of the warpgroup's 128.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 16 * warp_in_wg + lane / 4 + 8 * half;
    uint16_t* orow = p.out + int64_t(row) * p.N;
#pragma unroll
    for (int j = 0; j < (kSilu ? 8 : 16); ++j) {
      const int col = n0 + (kSilu ? 64 : 128) * wg + 8 * j + 2 * (lane % 4);
      float v[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float a = d[4 * j + 2 * half + h];
        if constexpr (kSilu) {
          v[h] = silu_mul_f32(round_bf16(a), round_bf16(d[4 * (j + 8) + 2 * half + h]));
        } else {
          v[h] = a;
        }
      }
      if (col + 1 < p.N) {
        *reinterpret_cast<uint32_t*>(orow + col) = f32_to_bf16_bits(v[0]) | (f32_to_bf16_bits(v[1]) << 16);
      } else if (col < p.N) {
        orow[col] = uint16_t(f32_to_bf16_bits(v[0]));
      }
    }
  }
#else
  (void)p;
#endif
}

PerDeviceFlag g_applies;

}  // namespace

bool moe_grouped_gemm_sm90_applies() {
  return g_applies.get([] {
    return current_device_is_sm90() &&
           kernel_binary_version(reinterpret_cast<const void*>(grouped_gemm_sm90_kernel<true>)) == 90 &&
           kernel_binary_version(reinterpret_cast<const void*>(grouped_gemm_sm90_kernel<false>)) == 90;
  });
}

void moe_grouped_gemm_sm90_launch(const MoeShape& s, const MoeProductParams& gate_up,
                                  const MoeProductParams& down, cudaStream_t stream) {
  KILN_CHECK(moe_grouped_gemm_sm90_applies(), "moe grouped GEMM sm90: needs an sm_90 device and sm_90a code");
  static const bool attr_set = [] {
    for (const void* k : {reinterpret_cast<const void*>(grouped_gemm_sm90_kernel<true>),
                          reinterpret_cast<const void*>(grouped_gemm_sm90_kernel<false>)})
      KILN_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    return true;
  }();
  const unsigned tiles = unsigned(s.max_tiles());
  LaunchCfg cfg{.grid = dim3(tiles, unsigned((s.I + 127) / 128)),
                .block = dim3(kThreads),
                .smem = kSmem,
                .stream = stream,
                .smem_attr_set = attr_set};
  launch(cfg, grouped_gemm_sm90_kernel<true>, gate_up);
  cfg.grid.y = unsigned((s.H + kBN - 1) / kBN);
  launch(cfg, grouped_gemm_sm90_kernel<false>, down);
}

}  // namespace kiln::cuda
