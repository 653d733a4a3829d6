#include "ops/argmax.h"

#include "ops/checks.h"
#include "ops/cpu/reference.h"
#include "ops/cuda/dispatch.h"

namespace kiln::ops {

void argmax_rows(const Tensor& logits, const Tensor& offsets, const Tensor& out) {
  constexpr const char* op = "argmax_rows";
  detail::check_matrix(op, "logits", logits, 2, DType::f32);
  KILN_CHECK(logits.shape[1] >= 1, op, ": logits need at least one column, got ", logits.describe());
  detail::check_matrix(op, "out", out, 1, DType::i32);
  KILN_CHECK(out.is_contiguous(), op, ": out must be contiguous");
  KILN_CHECK_EQ(out.shape[0], logits.shape[0], op, ": out rows vs logits rows");
  detail::check_same_device(op, logits, out);
  if (offsets.data != nullptr) {
    detail::check_matrix(op, "offsets", offsets, 1, DType::i64);
    KILN_CHECK(offsets.is_contiguous(), op, ": offsets must be contiguous");
    KILN_CHECK_EQ(offsets.shape[0], logits.shape[1], op, ": offsets vs logits columns");
    detail::check_same_device(op, logits, offsets);
  }
  if (out.device.is_cuda()) return KILN_CUDA_OP(argmax_rows(logits, offsets, out));
  cpu::argmax_rows(logits, offsets, out);
}

}  // namespace kiln::ops
