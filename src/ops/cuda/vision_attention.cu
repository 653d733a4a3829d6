// Variable-length bidirectional attention of the vision tower on tensor cores (mma.sync m16n8k16, bf16 in,
// fp32 accumulate), FlashAttention-2 style; contract in ops/vision_attention.h, launchers in
// ops/cuda/vision_attention.h.
#include "ops/cuda/common.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/vec.cuh"
#include "ops/cuda/vision_attention.h"

namespace kiln::cuda {
namespace {

constexpr int kBK = 64, kWarps = 4;  // keys per tile; warps per block
constexpr float kNegInf = -__builtin_huge_valf();
constexpr float kLog2e = 1.4426950408889634f;

// kMT: 16-row MMA tiles per warp (1 or 2), so a block owns BM = 16 kMT kWarps query rows. With kMT 2 each K
// and V fragment read from shared memory feeds two MMAs (half the ldmatrix traffic per FLOP).
template <int D, int kMT>
struct VarlenMmaCfg {
  static constexpr int kBM = 16 * kMT * kWarps, kThreads = 32 * kWarps, LD = D + 8, C8 = D / 8;
  static_assert(D % 16 == 0 && kBM <= 2 * kBK, "Q is staged in the second K/V stage");
  // Two stages of {K tile, V tile}, each [kBK][LD] bf16 (+8 pad: the 8 row addresses of every ldmatrix hit
  // distinct banks). Q is staged in stage 1 before its first use (kBM <= 2 kBK rows).
  static constexpr size_t kSmem = size_t(4 * kBK) * LD * 2;
};

// Rows [j0, j0 + kBK) of head h of K and V into one stage (K at dst, V at dst + kBK LD) with cp.async; rows
// at or past `end` (the segment's end) are zeroed with plain stores, so P = 0 never meets a NaN there. Not
// committed.
template <int D>
__device__ __forceinline__ void issue_kv_tile(const VarlenAttnParams& p, int64_t h, int j0, int end,
                                              uint16_t* dst) {
  constexpr int LD = D + 8, C8 = D / 8;
  for (int c = threadIdx.x; c < kBK * C8; c += kWarps * 32) {
    const int r = c / C8, cc = c % C8, j = j0 + r;
    uint16_t* dk = dst + r * LD + cc * 8;
    uint16_t* dv = dk + kBK * LD;
    if (j < end) {
      cp_async16(dk, p.k + int64_t(j) * p.ks + h * p.kh + cc * 8);
      cp_async16(dv, p.v + int64_t(j) * p.vs + h * p.vh + cc * 8);
    } else {
      *reinterpret_cast<uint4*>(dk) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(dv) = make_uint4(0, 0, 0, 0);
    }
  }
}

// Grid (S + floor(T / BM), Hn); block kWarps * 32 threads; dynamic smem VarlenMmaCfg::kSmem.
// Tile -> segment without a host copy of cu: segment s owns the grid columns [g(s), g(s + 1)) with
// g(s) = s + floor(cu[s] / BM). g(s + 1) - g(s) = 1 + floor(cu[s+1] / BM) - floor(cu[s] / BM) >=
// ceil(len_s / BM), so every tile of every segment has a column, and g(S) = S + floor(T / BM) columns cover
// them all; g is strictly increasing, so each block finds its s by a binary search of cu (log2 S loads).
// Column x of segment s is the query tile [cu[s] + BM (x - g(s)), + BM); columns past the segment's last
// tile (at most one per segment, plus the empty segments') exit at once.
// Block (x, h): query rows [q0, q0 + rows) of head h, rows <= BM. Warp w owns the kMT 16-row MMA tiles
// starting at q0 + 16 (kMT w + mt); lane l holds rows l / 4 and l / 4 + 8 of each, columns 2 (l % 4) + {0, 1}
// of each 8-wide accumulator tile (the m16n8k16 C layout). Q fragments stay in registers for the whole block.
// Per 64-key tile of the segment (K and V of tile kt + 1 copied by cp.async into the other stage while tile
// kt is computed; one barrier per tile):
//   S = Q K^T (fp32 MMA); keys at or past the segment's end -> -inf (last tile); online softmax in fp32 with
//   sl2 = scale * log2(e) (scale > 0): running max m of the raw scores, corr = 2^((m_old - m_new) sl2),
//   P = 2^(S sl2 - m sl2) (one fma, ex2.approx.ftz), l += P (fp32);
//   O += P V with P rounded to bf16 (the A operand; l keeps the unrounded P).
// Output: O / l (correctly rounded division), one rounding to bf16, 4-byte stores; rows past the segment's
// end are computed on zero queries and never stored.
template <int D, int kMT>
__global__ void __launch_bounds__(kWarps * 32)
    varlen_attention_mma_kernel(const __grid_constant__ VarlenAttnParams p) {
  using Cfg = VarlenMmaCfg<D, kMT>;
  constexpr int kBM = Cfg::kBM, LD = Cfg::LD, C8 = Cfg::C8;
  extern __shared__ uint4 smem_raw[];
  uint16_t* smem = reinterpret_cast<uint16_t*>(smem_raw);  // [2 stages][K, V][kBK][LD]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int x = int(blockIdx.x);
  const int64_t h = blockIdx.y;

  int lo = 0, hi = p.S;  // the s with g(s) <= x < g(s + 1); g(0) = 0 <= x
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (mid + p.cu[mid] / kBM <= x)
      lo = mid;
    else
      hi = mid;
  }
  const int b = p.cu[lo], e = p.cu[lo + 1];
  const int q0 = b + (x - (lo + b / kBM)) * kBM;
  if (q0 >= e) return;
  const int rows = min(kBM, e - q0), len = e - b, n_tiles = (len + kBK - 1) / kBK;

  // Q rows into stage 1 (zeros past the segment's end), K/V tile 0 into stage 0.
  uint16_t* sQ = smem + 2 * kBK * LD;
  for (int c = tid; c < kBM * C8; c += kWarps * 32) {
    const int r = c / C8, cc = c % C8;
    uint16_t* d = sQ + r * LD + cc * 8;
    if (r < rows)
      cp_async16(d, p.q + int64_t(q0 + r) * p.qs + h * p.qh + cc * 8);
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
  }
  issue_kv_tile<D>(p, h, b, e, smem);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qa[kMT][D / 16][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      ldmatrix_x4(qa[mt][kk],
                  smem_addr(sQ + ((kMT * warp + mt) * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + kk * 16 +
                            (lane / 16) * 8));

  float o[kMT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
  float m[kMT][2], l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) m[mt][0] = m[mt][1] = kNegInf, l[mt][0] = l[mt][1] = 0.0f;
  const float sl2 = p.scale * kLog2e;

  for (int kt = 0; kt < n_tiles; ++kt) {
    cp_async_wait<0>();
    __syncthreads();  // tile kt is visible; every warp is done with the other stage (tile kt - 1, or Q)
    if (kt + 1 < n_tiles) {
      issue_kv_tile<D>(p, h, b + (kt + 1) * kBK, e, smem + ((kt + 1) % 2) * 2 * kBK * LD);
      cp_async_commit();
    }
    const uint16_t* sK = smem + (kt % 2) * 2 * kBK * LD;
    const uint16_t* sV = sK + kBK * LD;

    float s[kMT][kBK / 8][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int i = 0; i < kBK / 8; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kBK / 16; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, smem_addr(sK + (np * 16 + (lane % 8) + (lane / 16) * 8) * LD + kk * 16 +
                                  ((lane / 8) % 2) * 8));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_bf16(s[mt][2 * np], qa[mt][kk], kb[0], kb[1]);
          mma_bf16(s[mt][2 * np + 1], qa[mt][kk], kb[2], kb[3]);
        }
      }
    }
    const int valid = len - kt * kBK;  // keys of this tile inside the segment (>= 1)
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      // Mask (the segment's last tile only) and the running max of the raw scores of rows g (i = 0, 1) and
      // g + 8 (i = 2, 3): scale > 0, so the max of the scaled scores is sl2 times it.
      float mx[2] = {kNegInf, kNegInf};
#pragma unroll
      for (int nt = 0; nt < kBK / 8; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = nt * 8 + (lane % 4) * 2 + (i & 1);
          if (valid < kBK && key >= valid) s[mt][nt][i] = kNegInf;
          mx[i >> 1] = fmaxf(mx[i >> 1], s[mt][nt][i]);
        }
      }
      float msl2[2];  // the new running max, scaled: P = 2^(s sl2 - m sl2), one fma and one ex2
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mn = fmaxf(m[mt][r], mx[r]);  // finite: every tile holds >= 1 key of the segment
        const float corr = exp2_approx((m[mt][r] - mn) * sl2);  // 0 on the first tile (m = -inf)
        l[mt][r] *= corr;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) o[mt][i][2 * r] *= corr, o[mt][i][2 * r + 1] *= corr;
        m[mt][r] = mn;
        msl2[r] = mn * sl2;
      }
#pragma unroll
      for (int nt = 0; nt < kBK / 8; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[mt][nt][i] = exp2_approx(fmaf(s[mt][nt][i], sl2, -msl2[i >> 1]));
          l[mt][i >> 1] += s[mt][nt][i];
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      // P of keys 16 kk .. + 15 as the A operand: a0 = (row g, keys 2c, 2c+1), a1 = (g + 8, same keys),
      // a2, a3 = the same rows, keys + 8 (the C layout of n-tiles 2 kk and 2 kk + 1).
      uint32_t pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pa[mt][0] = pack_bf16x2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack_bf16x2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack_bf16x2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack_bf16x2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, smem_addr(sV + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + dp * 16 +
                                        (lane / 16) * 8));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_bf16(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          mma_bf16(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
  }

#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mt][r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const int qr = (kMT * warp + mt) * 16 + lane / 4 + 8 * r;
      if (qr >= rows) continue;
      uint16_t* dst = p.out + int64_t(q0 + qr) * p.os + h * p.oh + (lane % 4) * 2;
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt)
        *reinterpret_cast<uint32_t*>(dst + nt * 8) =
            pack_bf16x2(__fdiv_rn(o[mt][nt][2 * r], lr), __fdiv_rn(o[mt][nt][2 * r + 1], lr));
    }
  }
}

// Resident blocks of varlen_attention_mma_kernel<D, kMT> on the first device asked (thread-safe static init;
// every GPU of a machine is the same part). Used by the block-height choice only.
template <int D, int kMT>
int resident_blocks() {
  static const int n = [] {
    using Cfg = VarlenMmaCfg<D, kMT>;
    static_assert(Cfg::kSmem <= 48 * 1024, "the occupancy query assumes the default smem limit");
    int dev = 0, sms = 0, per_sm = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, varlen_attention_mma_kernel<D, kMT>, Cfg::kThreads, Cfg::kSmem));
    return sms * (per_sm > 0 ? per_sm : 1);
  }();
  return n;
}

// D 128 needs 68 KB of dynamic smem: launch() raises the kernel's limit (on the current device) each call.
template <int D, int kMT>
void launch_mma(const VarlenAttnParams& p, cudaStream_t stream) {
  using Cfg = VarlenMmaCfg<D, kMT>;
  launch(LaunchCfg{.grid = dim3(unsigned(int64_t(p.S) + p.T / Cfg::kBM), unsigned(p.Hn)),
                   .block = dim3(Cfg::kThreads),
                   .smem = Cfg::kSmem,
                   .stream = stream},
         varlen_attention_mma_kernel<D, kMT>, p);
}

bool aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

}  // namespace

bool varlen_attention_mma_applies(const VarlenAttnParams& p) {
  if (p.D != 64 && p.D != 128) return false;
  if (!(p.scale > 0.0f) || p.scale == __builtin_huge_valf()) return false;  // the max is taken before scaling
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v)) return false;
  for (int64_t s : {p.qs, p.qh, p.ks, p.kh, p.vs, p.vh})
    if (s % 8 != 0) return false;
  return p.os % 2 == 0 && p.oh % 2 == 0 && reinterpret_cast<uintptr_t>(p.out) % 4 == 0;  // 4-byte stores
}

int varlen_attention_mma_tile_rows(const VarlenAttnParams& p) {
  if (p.D != 64) return 64;
  // 128 rows (two MMA tiles a warp) halve the shared-memory reads per FLOP but take ~255 registers (fewer
  // resident blocks): where their grid is under kWaves128 waves of resident blocks, the tail of the launch
  // would idle much of the GPU, and 64-row blocks fill it better.
  constexpr int64_t kWaves128 = 2;
  return (p.T / 128 + p.S) * p.Hn >= kWaves128 * resident_blocks<64, 2>() ? 128 : 64;
}

void launch_varlen_attention_mma(const VarlenAttnParams& p, cudaStream_t stream, int tile_rows) {
  KILN_CHECK(varlen_attention_mma_applies(p), "varlen_attention: the tensor-core kernel does not apply");
  if (tile_rows == 0) tile_rows = varlen_attention_mma_tile_rows(p);
  KILN_CHECK(tile_rows == 64 || (tile_rows == 128 && p.D == 64), "varlen_attention: tile_rows ", tile_rows,
             " (64; 128 with head_dim 64)");
  if (p.T == 0) return;
  if (p.D == 64 && tile_rows == 128)
    launch_mma<64, 2>(p, stream);
  else if (p.D == 64)
    launch_mma<64, 1>(p, stream);
  else
    launch_mma<128, 1>(p, stream);
}

void launch_varlen_attention(const VarlenAttnParams& p, cudaStream_t stream) {
  if (p.T == 0) return;
  if (varlen_attention_mma_applies(p)) return launch_varlen_attention_mma(p, stream);
  launch_varlen_attention_simt(p, stream);
}

}  // namespace kiln::cuda
