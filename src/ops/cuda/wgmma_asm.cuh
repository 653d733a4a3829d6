// What every wgmma.mma_async wrapper shares (wgmma_bf16.cuh, wgmma_fp8.cuh), sm_90a only: the accumulator's
// layout and operand lists, the asm of the two operand forms, and fence_regs.
// Accumulator d (N / 2 floats a thread, M = 64 rows per warpgroup, fp32): warp w of the warpgroup owns rows
// 16 w .. 16 w + 15; d[4 j + e] is row 16 w + lane / 4 + 8 (e / 2), column 8 j + 2 (lane % 4) + (e % 2), the
// mma.sync m16n8 C layout repeated over N / 8 column blocks, whatever the operand type. scale_d 0: d = A B
// (the accumulator's old value is ignored), 1: d += A B. A wrapper is one KILN_WGMMA_SS (A and B from shared
// memory, by descriptor) or KILN_WGMMA_RS (A from four registers, B by descriptor) line: the asm is written
// once here, so every wrapper emits the same instruction sequence: setp of the scale_d predicate, the
// descriptors packed into 64-bit registers, one wgmma.
#pragma once

#include <cstdint>

#include "ops/cuda/sm90.cuh"

// The accumulator's operand list, one "+f" operand a register: d[i] .. d[i + 7], d[i] .. d[i + 31].
#define KILN_WGMMA_ACC8(d, i)                                                                             \
  "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), \
      "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define KILN_WGMMA_ACC32(d, i)                                                        \
  KILN_WGMMA_ACC8(d, (i)), KILN_WGMMA_ACC8(d, (i) + 8), KILN_WGMMA_ACC8(d, (i) + 16), \
      KILN_WGMMA_ACC8(d, (i) + 24)
#define KILN_WGMMA_ACC_32(d) KILN_WGMMA_ACC32(d, 0)
#define KILN_WGMMA_ACC_64(d) KILN_WGMMA_ACC32(d, 0), KILN_WGMMA_ACC32(d, 32)
#define KILN_WGMMA_ACC_96(d) KILN_WGMMA_ACC32(d, 0), KILN_WGMMA_ACC32(d, 32), KILN_WGMMA_ACC32(d, 64)

// The same registers as the asm names them: the accumulator is operands %0 .. %(NACC - 1).
#define KILN_WGMMA_REGS_32                                                 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define KILN_WGMMA_REGS_64                                                             \
  KILN_WGMMA_REGS_32                                                                   \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define KILN_WGMMA_REGS_96                                                             \
  KILN_WGMMA_REGS_64                                                                   \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"

// KILN_WGMMA_SS(NAME, SHAPE, NACC, TAIL, A_LO, A_HI, B_LO, B_HI, P): defines
//   void NAME(float (&d)[NACC], WgmmaDesc desc_a, WgmmaDesc desc_b, uint32_t scale_d)
// issuing `wgmma.mma_async.sync.aligned.SHAPE {d}, da, db, p, 1, 1 TAIL`. SHAPE: "m64nNkK.f32.TYPE.TYPE";
// TAIL: the operand-type-specific immediates after scale-a and scale-b (bf16: ", 0, 0", A and B not
// transposed; FP8 takes none: ""). The input operands follow the accumulator, so their numbers are NACC,
// NACC + 1, ...: A_LO A_HI B_LO B_HI P name them as literals (the asm text cannot add). Both macros are kept
// out of clang-format: one piece of asm text a line.
// clang-format off
#define KILN_WGMMA_SS(NAME, SHAPE, NACC, TAIL, A_LO, A_HI, B_LO, B_HI, P)                   \
  __device__ __forceinline__ void NAME(float(&d)[NACC], WgmmaDesc desc_a, WgmmaDesc desc_b, \
                                       uint32_t scale_d) {                                  \
    asm volatile(                                                                           \
        "{\n.reg .pred p;\n.reg .b64 da, db;\n"                                             \
        "setp.ne.b32 p, %" #P ", 0;\n"                                                      \
        "mov.b64 da, {%" #A_LO ", %" #A_HI "};\n"                                           \
        "mov.b64 db, {%" #B_LO ", %" #B_HI "};\n"                                           \
        "wgmma.mma_async.sync.aligned." SHAPE " {" KILN_WGMMA_REGS_##NACC "}, "             \
        "da, db, p, 1, 1" TAIL ";\n}\n"                                                     \
        : KILN_WGMMA_ACC_##NACC(d)                                                          \
        : "r"(desc_a.lo), "r"(desc_a.hi), "r"(desc_b.lo), "r"(desc_b.hi), "r"(scale_d));    \
  }
// clang-format on

// KILN_WGMMA_RS(NAME, SHAPE, NACC, TAIL, A0, A1, A2, A3, B_LO, B_HI, P): defines
//   void NAME(float (&d)[NACC], const uint32_t (&a)[4], WgmmaDesc desc_b, uint32_t scale_d)
// issuing `wgmma.mma_async.sync.aligned.SHAPE {d}, {a}, db, p, 1, 1 TAIL` (bf16 TAIL ", 1": B transposed,
// MN-major). Operand numbers as for KILN_WGMMA_SS.
// clang-format off
#define KILN_WGMMA_RS(NAME, SHAPE, NACC, TAIL, A0, A1, A2, A3, B_LO, B_HI, P)                        \
  __device__ __forceinline__ void NAME(float(&d)[NACC], const uint32_t(&a)[4], WgmmaDesc desc_b,     \
                                       uint32_t scale_d) {                                           \
    asm volatile(                                                                                    \
        "{\n.reg .pred p;\n.reg .b64 db;\n"                                                          \
        "setp.ne.b32 p, %" #P ", 0;\n"                                                               \
        "mov.b64 db, {%" #B_LO ", %" #B_HI "};\n"                                                    \
        "wgmma.mma_async.sync.aligned." SHAPE " {" KILN_WGMMA_REGS_##NACC "}, "                      \
        "{%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, db, p, 1, 1" TAIL ";\n}\n"                         \
        : KILN_WGMMA_ACC_##NACC(d)                                                                   \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(desc_b.lo), "r"(desc_b.hi), "r"(scale_d)); \
  }
// clang-format on

namespace kiln::cuda::sm90 {

#ifdef KILN_SM90A

// Pins the accumulator registers in place (no instruction): the compiler may not move their reads or
// writes across it, e.g. a use of the product above the wgmma_wait that completes it (CUTLASS's
// warpgroup_fence_operand).
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#endif  // KILN_SM90A

}  // namespace kiln::cuda::sm90
