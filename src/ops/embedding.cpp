#include "ops/embedding.h"

#include "ops/checks.h"
#include "ops/cpu/reference.h"
#include "ops/cuda/dispatch.h"

namespace kiln::ops {

void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  constexpr const char* op = "embedding";
  detail::check_matrix(op, "table", table, 2, DType::bf16);
  detail::check_matrix(op, "ids", ids, 1, DType::i32);
  KILN_CHECK(out.ndim == 2 && (out.dtype == DType::bf16 || out.dtype == DType::f32), op,
             ": out must be bf16 or f32 [T, H], got ", out.describe());
  detail::check_matrix(op, "out", out, 2, out.dtype);
  KILN_CHECK(ids.is_contiguous(), op, ": ids must be contiguous");
  KILN_CHECK_EQ(out.shape[0], ids.shape[0], op, ": out rows vs ids");
  KILN_CHECK_EQ(out.shape[1], table.shape[1], op, ": out width vs table width");
  detail::check_same_device(op, table, ids);
  detail::check_same_device(op, table, out);
  if (out.device.is_cuda()) return KILN_CUDA_OP(embedding(table, ids, out));
  cpu::embedding(table, ids, out);
}

}  // namespace kiln::ops
