// wgmma.mma_async wrappers for bf16 (bf16 x bf16, fp32 accumulate, M = 64 rows per warpgroup, K = 16 a step),
// sm_90a only; the accumulator layout and the asm: wgmma_asm.cuh. A from registers (_rs): a[0..3] hold rows
// lane / 4 (+ 8 for a[1], a[3]) at k = 2 (lane % 4) + {0, 1} (+ 8 for a[2], a[3]): the m16n8k16 A layout, so
// two adjacent n8 blocks of an accumulator, rounded to bf16 pairs, are the A operand of the next product.
// _ss: A and B from K-major 128-byte-swizzled shared memory; _rs: B MN-major (transposed), as V is stored
// (sm90.cuh).
#pragma once

#include <cstdint>

#include "ops/cuda/sm90.cuh"
#include "ops/cuda/wgmma_asm.cuh"

namespace kiln::cuda::sm90 {

#ifdef KILN_SM90A

// Immediates after scale-a and scale-b: _ss "0, 0" (neither operand transposed), _rs "1" (B transposed).
KILN_WGMMA_SS(wgmma_m64n128k16_ss, "m64n128k16.f32.bf16.bf16", 64, ", 0, 0", 64, 65, 66, 67, 68)
KILN_WGMMA_RS(wgmma_m64n128k16_rs, "m64n128k16.f32.bf16.bf16", 64, ", 1", 64, 65, 66, 67, 68, 69, 70)
KILN_WGMMA_RS(wgmma_m64n64k16_rs, "m64n64k16.f32.bf16.bf16", 32, ", 1", 32, 33, 34, 35, 36, 37, 38)

#endif  // KILN_SM90A

}  // namespace kiln::cuda::sm90
