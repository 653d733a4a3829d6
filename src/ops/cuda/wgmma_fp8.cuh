// wgmma.mma_async wrappers for FP8 (e4m3 x e4m3, fp32 accumulate, M = 64 rows per warpgroup, K = 32 a step),
// sm_90a only; the accumulator layout, the asm and fence_regs: wgmma_asm.cuh. Both operands K-major in
// 128-byte-swizzled shared memory (FP8 wgmma takes no transpose: a row of 128 e4m3 is one 128-byte swizzle
// row, so a k32 step advances the descriptor by 32 bytes, as a k16 step of bf16 does; sm90.cuh). The tensor
// cores add FP8 products in reduced precision (the DeepSeek-V3 report: about 14 bits kept), so callers
// promote every few steps into an fp32 accumulator of their own.
#pragma once

#include <cstdint>

#include "ops/cuda/sm90.cuh"
#include "ops/cuda/wgmma_asm.cuh"

namespace kiln::cuda::sm90 {

#ifdef KILN_SM90A

KILN_WGMMA_SS(wgmma_m64n64k32_e4m3, "m64n64k32.f32.e4m3.e4m3", 32, "", 32, 33, 34, 35, 36)
KILN_WGMMA_SS(wgmma_m64n128k32_e4m3, "m64n128k32.f32.e4m3.e4m3", 64, "", 64, 65, 66, 67, 68)
KILN_WGMMA_SS(wgmma_m64n192k32_e4m3, "m64n192k32.f32.e4m3.e4m3", 96, "", 96, 97, 98, 99, 100)

#endif  // KILN_SM90A

}  // namespace kiln::cuda::sm90
