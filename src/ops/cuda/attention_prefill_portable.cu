// Portable causal paged prefill attention on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate; any
// sm_80+ GPU): PrefillKernel v1, v2 and v3 (ops/cuda/attention.h), the fallback of the Hopper wgmma kernel.
#include "ops/cuda/attention_common.cuh"
#include "ops/cuda/mma.cuh"

namespace kiln::cuda {
namespace {

constexpr int kBQ = 64, kBK = 64, kWarps = 4;  // kWarps: the warps of one query head (16 rows each)
// v3: query heads of one KV group per block (kWarps warps each). 2 keeps D 128 at v2's occupancy (174 vs
// 183 registers a thread, ptxas: 8 warps per SM either way) while each K/V tile is loaded once for both
// heads; 4 would need <= 128 registers. (D 64: 8 warps per SM where v2 fits 12.)
constexpr int kV3Heads = 2;
constexpr float kNegInf = -__builtin_huge_valf();

// Copies rows [kt * 64, kt * 64 + 64) of the K (kV false) or V cache of (b, hk) into the [64][LD] tile
// with cp.async (bf16 cache only), kThreads threads (the block) sharing the 16-byte chunks; rows past
// last_pos are zeroed with plain stores. Not committed.
template <int D, bool kV, int kThreads>
__device__ __forceinline__ void issue_tile_async(const PagedAttnParams& p, int b, int hk, int kt,
                                                 int last_pos, uint16_t* dst) {
  constexpr int LD = D + 8, C8 = D / 8;
  const uint16_t* src = static_cast<const uint16_t*>(kV ? p.v : p.k);
  for (int c = threadIdx.x; c < kBK * C8; c += kThreads) {
    const int r = c / C8, cc = c % C8, key = kt * kBK + r;
    uint16_t* d = dst + r * LD + cc * 8;
    if (key <= last_pos) {
      int64_t sc_off;
      cp_async16(d, src + kv_row_offset(p, b, key, hk, &sc_off) + cc * 8);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  }
}

// v1's tile load: K and V rows of tile kt gathered with plain loads (fp8 widened exactly to bf16), rows past
// last_pos zeroed; between two __syncthreads (kThreads threads: the block).
template <int D, KvDtype KT, int kThreads>
__device__ __forceinline__ void load_tile_sync(const PagedAttnParams& p, int b, int hk, int kt, int last_pos,
                                               uint16_t* sK, uint16_t* sV) {
  constexpr int LD = D + 8, C8 = D / 8;
  __syncthreads();  // the previous tile's K and V are consumed
  for (int c = threadIdx.x; c < kBK * C8; c += kThreads) {
    const int r = c / C8, cc = c % C8, key = kt * kBK + r;
    uint4 kv[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
    if (key <= last_pos) {
      int64_t sc_off;
      const int64_t off = kv_row_offset(p, b, key, hk, &sc_off);
      if constexpr (KT == KvDtype::bf16) {
        kv[0] = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.k) + off + cc * 8);
        kv[1] = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.v) + off + cc * 8);
      } else {
        float f[8];
        load_kv8<KT>(p.k, p.k_scale, off, sc_off, cc * 8, f);
        kv[0] = pack8(f);
        load_kv8<KT>(p.v, p.v_scale, off, sc_off, cc * 8, f);
        kv[1] = pack8(f);
      }
    }
    *reinterpret_cast<uint4*>(sK + r * LD + cc * 8) = kv[0];
    *reinterpret_cast<uint4*>(sV + r * LD + cc * 8) = kv[1];
  }
  __syncthreads();
}

// Grid (ceil(T / 64), Hq, B) (kHeads 1) or (Hkv * ceil(G / kHeads), ceil(T / 64), B) (v3), G = Hq / Hkv;
// block kHeads * 4 warps; dynamic smem:
// kHeads Q tiles, one K and one V tile, each [64][D + 8] bf16 (the +8 pad makes the 8 row addresses of every
// ldmatrix hit distinct banks).
// Block (tile, hk * ceil(G / kHeads) + j, b) (v3: the first two swapped, tiles in reverse) owns query rows
// [64 tile, 64 tile + 64) of sequence b and the query heads hk G + j kHeads + i (i < kHeads, those < (hk + 1)
// G: in the last block of a group that G does not divide, the warps of the missing heads only take part in
// the loads and barriers). Warp w computes head slot i = w / 4, rows 16 (w % 4) .. + 15, with exactly the
// arithmetic of a kHeads = 1 block.
//   v1: kHeads 1, K/V tiles gathered with plain loads between two barriers (load_tile_sync).
//   v2 (kPipe): kHeads 1, K and V copied by cp.async so they overlap the math: V of tile kt is in flight
//       while S = Q K^T and the softmax run, K of tile kt + 1 while O += P V runs (one K and one V tile).
//   v3: v2 with kHeads = kV3Heads: each K/V tile is copied (fp8: widened) once for the heads of a group
//       instead of once per head. v1, v2 and v3 are bitwise equal: the per-warp math and its order do not
//       change.
// Per 64-key tile: K and V rows gathered through the page table into smem (fp8 widened exactly to bf16,
// rows past the causal bound zeroed), S = Q K^T by MMA, mask, online softmax in fp32 (expf), then
// O += P V with P split into bf16 hi + lo (two MMAs) so P keeps ~16 bits. Output: O / l, one bf16 rounding.
template <int D, KvDtype KT, bool kV2, int kHeads>
__global__ void __launch_bounds__(kWarps * 32 * kHeads)
    prefill_kernel(const __grid_constant__ PagedAttnParams p, bool skip_single) {
  constexpr bool kPipe = kV2 && KT == KvDtype::bf16;  // the cp.async path copies bf16 rows as they are
  constexpr int LD = D + 8, C8 = D / 8, kThreads = kWarps * 32 * kHeads;
  extern __shared__ uint4 smem_raw[];
  uint16_t* sQ = reinterpret_cast<uint16_t*>(smem_raw);  // [kHeads][64][LD]
  uint16_t* sK = sQ + kHeads * kBQ * LD;
  uint16_t* sV = sK + kBK * LD;
  // v3's grid is (head blocks, tiles, B) walked last tile first: the blocks with the most keys (causal)
  // start first, so the short ones fill the tail of the launch.
  const int tile = kHeads == 1 ? int(blockIdx.x) : int(gridDim.y - 1 - blockIdx.y), b = blockIdx.z;
  const int hblock = kHeads == 1 ? blockIdx.y : blockIdx.x;
  const int tid = threadIdx.x, warp = (tid / 32) % kWarps, slot = tid / 32 / kWarps, lane = tid % 32;
  pdl_wait();
  const int q0 = p.cu_q[b], q_len = p.cu_q[b + 1] - q0;
  if (q_len <= 0 || (skip_single && q_len == 1) || tile * kBQ >= q_len) return;
  const int kv_len = p.kv_lens[b];
  // A kv_len below q_len or beyond the page table's reach violates the contract: skipped, never read.
  if (kv_len < q_len || kv_len > int64_t(p.pages_stride) * p.page_size) return;
  const int G = p.Hq / p.Hkv, chunks = (G + kHeads - 1) / kHeads;
  const int hk = hblock / chunks, g0 = (hblock % chunks) * kHeads;  // the block's first head: hk G + g0
  const int h = hk * G + g0 + slot;
  const bool active = kHeads == 1 || g0 + slot < G;  // warp-uniform
  const int rows = min(kBQ, q_len - tile * kBQ);
  const int pos0 = kv_len - q_len + tile * kBQ;  // context position of the tile's first row
  const int last_pos = pos0 + rows - 1;

  if constexpr (kPipe) {
    issue_tile_async<D, false, kThreads>(p, b, hk, 0, last_pos, sK);
    cp_async_commit();
  }
  for (int c = tid; c < kHeads * kBQ * C8; c += kThreads) {
    const int i = c / (kBQ * C8), r = c / C8 % kBQ, cc = c % C8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (r < rows && g0 + i < G)
      val = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.q) +
                                            int64_t(q0 + tile * kBQ + r) * p.q_stride_t +
                                            int64_t(hk * G + g0 + i) * p.q_stride_h + cc * 8);
    *reinterpret_cast<uint4*>(sQ + (i * kBQ + r) * LD + cc * 8) = val;
  }
  __syncthreads();
  uint32_t qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrix_x4(qa[kk], smem_addr(sQ + (slot * kBQ + warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD +
                                  kk * 16 + (lane / 16) * 8));

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
  const int row_pos[2] = {pos0 + warp * 16 + lane / 4, pos0 + warp * 16 + lane / 4 + 8};
  const int n_tiles = last_pos / kBK + 1;

  for (int kt = 0; kt < n_tiles; ++kt) {
    if constexpr (kPipe) {
      cp_async_wait<0>();
      __syncthreads();  // K of tile kt is visible; the previous tile's V is consumed
      issue_tile_async<D, true, kThreads>(p, b, hk, kt, last_pos, sV);
      cp_async_commit();
    } else {
      load_tile_sync<D, KT, kThreads>(p, b, hk, kt, last_pos, sK, sV);
    }

    float s[kBK / 8][4];
    if (active) {
#pragma unroll
      for (int i = 0; i < kBK / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < kBK / 16; ++np) {
          uint32_t kb[4];
          ldmatrix_x4(kb, smem_addr(sK + (np * 16 + (lane % 8) + (lane / 16) * 8) * LD + kk * 16 +
                                    ((lane / 8) % 2) * 8));
          mma_bf16(s[2 * np], qa[kk], kb[0], kb[1]);
          mma_bf16(s[2 * np + 1], qa[kk], kb[2], kb[3]);
        }
      }
      // Scale, mask, and the running max of rows g (e = 0, 1) and g + 8 (e = 2, 3).
      float mx[2] = {kNegInf, kNegInf};
#pragma unroll
      for (int nt = 0; nt < kBK / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kt * kBK + nt * 8 + (lane % 4) * 2 + (e & 1);
          s[nt][e] = key <= row_pos[e >> 1] ? s[nt][e] * p.scale : kNegInf;
          mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mn = fmaxf(m[r], mx[r]);  // finite: key 0 is visible to every row from tile 0 on
        const float corr = expf(m[r] - mn);
        l[r] *= corr;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) o[i][2 * r] *= corr, o[i][2 * r + 1] *= corr;
        m[r] = mn;
      }
#pragma unroll
      for (int nt = 0; nt < kBK / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[nt][e] = expf(s[nt][e] - m[e >> 1]);
          l[e >> 1] += s[nt][e];
        }
      }
    }
    if constexpr (kPipe) {
      cp_async_wait<0>();
      __syncthreads();  // V of tile kt is visible; every warp is done with K of tile kt
      if (kt + 1 < n_tiles) {
        issue_tile_async<D, false, kThreads>(p, b, hk, kt + 1, last_pos, sK);
        cp_async_commit();
      }
    }
    if (active) {
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        uint32_t hi[4], lo[4];
        const float* pa = s[2 * kk];
        const float* pb = s[2 * kk + 1];
        const float pv[8] = {pa[0], pa[1], pa[2], pa[3], pb[0], pb[1], pb[2], pb[3]};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float h0 = round_bf16(pv[2 * i]), h1 = round_bf16(pv[2 * i + 1]);
          hi[i] = pack_bf16x2(h0, h1);
          lo[i] = pack_bf16x2(pv[2 * i] - h0, pv[2 * i + 1] - h1);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, smem_addr(sV + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + dp * 16 +
                                          (lane / 16) * 8));
          mma_bf16(o[2 * dp], hi, vb[0], vb[1]);
          mma_bf16(o[2 * dp], lo, vb[0], vb[1]);
          mma_bf16(o[2 * dp + 1], hi, vb[2], vb[3]);
          mma_bf16(o[2 * dp + 1], lo, vb[2], vb[3]);
        }
      }
    }
  }
  if (active) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int qr = warp * 16 + lane / 4 + 8 * r;
      if (qr >= rows) continue;
      uint16_t* dst = static_cast<uint16_t*>(p.out) + int64_t(q0 + tile * kBQ + qr) * p.o_stride_t +
                      int64_t(h) * p.o_stride_h + (lane % 4) * 2;
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt)
        *reinterpret_cast<uint32_t*>(dst + nt * 8) =
            pack_bf16x2(__fdiv_rn(o[nt][2 * r], l[r]), __fdiv_rn(o[nt][2 * r + 1], l[r]));
    }
  }
  pdl_launch_dependents();
}

}  // namespace

// v3 runs where it shares tiles: G >= 2, D >= 64 (D 32 is no Qwen3 shape; it runs v2). With an fp8 cache
// the shared tiles are v1's widening loads (once per head pair instead of once per head).
bool prefill_v3_applies(const PagedAttnParams& p) {
  return p.Hq / p.Hkv >= 2 && p.D >= 64;
}

namespace {

// v3's launch (a template so the instantiations it names exist only where it applies): false where it
// does not (prefill_v3_applies covers the runtime side, this the compile-time one).
template <int D, KvDtype KT>
bool launch_v3(LaunchCfg cfg, const PagedAttnParams& p, bool skip_single_rows) {
  if constexpr (D >= 64) {
    const int G = p.Hq / p.Hkv;
    cfg.grid = dim3(unsigned(p.Hkv * ((G + kV3Heads - 1) / kV3Heads)), cfg.grid.x, cfg.grid.z);
    cfg.block = dim3(kV3Heads * kWarps * 32);
    cfg.smem = size_t(kV3Heads * kBQ + 2 * kBK) * (D + 8) * 2;
    launch(cfg, prefill_kernel<D, KT, true, kV3Heads>, p, skip_single_rows);
    return true;
  } else {
    return false;
  }
}

}  // namespace

void launch_prefill(const PagedAttnParams& p, bool skip_single_rows, PrefillKernel kernel,
                    cudaStream_t stream, bool pdl) {
  if (kernel == PrefillKernel::v4) {
    if (launch_prefill_sm90(p, skip_single_rows, stream, pdl)) return;
    kernel = PrefillKernel::v3;
  }
  const unsigned tiles = unsigned((p.T + kBQ - 1) / kBQ);
  KILN_DISPATCH_HEAD_DIM(p.D, KILN_DISPATCH_KV_DTYPE(p.kv_dtype, {
                           const LaunchCfg cfg{.grid = dim3(tiles, unsigned(p.Hq), unsigned(p.B)),
                                               .block = dim3(kWarps * 32),
                                               .smem = size_t(kBQ + 2 * kBK) * (kD + 8) * 2,
                                               .stream = stream,
                                               .pdl = pdl};
                           if (kernel == PrefillKernel::v3 && prefill_v3_applies(p) &&
                               launch_v3<kD, kKT>(cfg, p, skip_single_rows))
                             return;
                           // v2 pipelines bf16 caches; an fp8 cache is widened on the way in (v1's load).
                           if (kernel != PrefillKernel::v1 && kKT == KvDtype::bf16)
                             launch(cfg, prefill_kernel<kD, kKT, true, 1>, p, skip_single_rows);
                           else
                             launch(cfg, prefill_kernel<kD, kKT, false, 1>, p, skip_single_rows);
                         }))
}

}  // namespace kiln::cuda
