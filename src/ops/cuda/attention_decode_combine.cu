// The split-KV combine of the paged decode kernels (v1, v2 and v3: attention_common.cuh,
// launch_decode_combine): merges each row's per-split partial outputs, maxima and sums from the workspace.
#include "ops/cuda/attention_common.cuh"

namespace kiln::cuda {
namespace {

constexpr float kNegInf = -__builtin_huge_valf();

// Grid (Hq, row groups: decode_row_groups); block D threads, per row: the split maxima and weights w_s = l_s
// exp(m_s - M) computed split-parallel into shared memory, then thread d sums w_s o_s[d] over the splits in
// order: the first 16 o_s[d] (48 when the row has more than 16 splits: B = 1 runs 33) loaded before the
// maxima, one DRAM / L2 round trip for both, the rest 16 loads in flight at a time (empty splits hold o = 0
// and weight 0). kChunkTile > 0 (v2: 32, v3: 64): only the ceil(ctx / decode_chunk(ctx, splits, kChunkTile))
// splits that ran are read, and a row with one such split (written out by its decode block) is skipped; 0
// (v1): every split.
template <int D, int kChunkTile>
__global__ void __launch_bounds__(D)
    combine_kernel(const __grid_constant__ PagedAttnParams p, const float* ws, int splits, bool all_rows) {
  static_assert(D % 32 == 0 && D <= 1024, "one thread per element of head_dim");
  constexpr int kMaxSplits = 128;
  __shared__ float sw[kMaxSplits];
  __shared__ float red[D / 32];
  const int h = blockIdx.x, d = threadIdx.x;
  // The row metadata before the wait: the decode kernel before this one launches without PDL (everything
  // before it is done once it runs) and never writes cu_q or kv_lens, so they are final when this starts.
  DecodeRows r;
  const bool rows = decode_rows(p, blockIdx.y, all_rows, &r);
  pdl_wait();
  if (rows) {
    const float* ml = ws + decode_row_groups(p) * p.Hq * splits * D;
    for (int row = r.row0; row < r.row0 + r.n; ++row) {
      int used = splits;
      if constexpr (kChunkTile > 0) {
        const int ctx = r.ctx0 + (row - r.row0);
        const int chunk = decode_chunk(ctx, splits, kChunkTile);
        used = (ctx + chunk - 1) / chunk;
        if (used <= 1) continue;  // uniform over the block
      }
      const int64_t base = (int64_t(decode_ws_slot(p, blockIdx.y, row)) * p.Hq + h) * splits;
      // The row with the first kEarly splits' outputs loaded before the maxima: they do not depend on the
      // weights, so one round trip serves both (the sums below take the same terms in the same order).
      // kEarly 48 for rows of more than 16 splits (B = 1 runs 33), else 16.
      const auto combine_row = [&]<int kEarly>() {
        float early[kEarly];
#pragma unroll
        for (int i = 0; i < kEarly; ++i) early[i] = i < used ? ws[(base + i) * D + d] : 0.0f;
        float m = kNegInf;
        for (int s = d; s < used; s += D) m = fmaxf(m, ml[2 * (base + s)]);
#pragma unroll
        for (int off = 16; off >= 1; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        if (d % 32 == 0) red[d / 32] = m;
        __syncthreads();
        float M = kNegInf;
#pragma unroll
        for (int w = 0; w < D / 32; ++w) M = fmaxf(M, red[w]);
        for (int s = d; s < used; s += D) {
          const float ms = ml[2 * (base + s)];
          sw[s] = ms == kNegInf ? 0.0f : ml[2 * (base + s) + 1] * expf(ms - M);
        }
        __syncthreads();
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int i = 0; i < kEarly; ++i) {
          if (i < used) {
            L += sw[i];
            O = fmaf(sw[i], early[i], O);
          }
        }
        for (int s0 = kEarly; s0 < used; s0 += 16) {
          float v[16];
#pragma unroll
          for (int i = 0; i < 16; ++i) v[i] = s0 + i < used ? ws[(base + s0 + i) * D + d] : 0.0f;
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            if (s0 + i < used) {
              L += sw[s0 + i];
              O = fmaf(sw[s0 + i], v[i], O);
            }
          }
        }
        static_cast<uint16_t*>(p.out)[int64_t(row) * p.o_stride_t + int64_t(h) * p.o_stride_h + d] =
            uint16_t(f32_to_bf16_bits(__fdiv_rn(O, L)));
      };
      if (used > 16) {
        combine_row.template operator()<48>();
      } else {
        combine_row.template operator()<16>();
      }
      __syncthreads();  // sw and red are reused by the next row
    }
  }
  pdl_launch_dependents();
}

}  // namespace

void launch_decode_combine(const PagedAttnParams& p, const float* ws, int splits, bool all_rows,
                           DecodeKernel kernel, cudaStream_t stream, bool pdl) {
  KILN_DISPATCH_HEAD_DIM(p.D, {
    const LaunchCfg cfg{.grid = dim3(unsigned(p.Hq), unsigned(decode_row_groups(p))),
                        .block = dim3(kD),
                        .stream = stream,
                        .pdl = pdl};
    if (kernel == DecodeKernel::v1)
      launch(cfg, combine_kernel<kD, 0>, p, ws, splits, all_rows);
    else if (kernel == DecodeKernel::v2)
      launch(cfg, combine_kernel<kD, kDecodeV2Tile>, p, ws, splits, all_rows);
    else if (p.kv_dtype == KvDtype::bf16)
      launch(cfg, combine_kernel<kD, kDecodeSm90Tile>, p, ws, splits, all_rows);
    else
      launch(cfg, combine_kernel<kD, kDecodeSm90TileFp8>, p, ws, splits, all_rows);
  })
}

}  // namespace kiln::cuda
