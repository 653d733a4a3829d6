#include "ops/argmax.h"

#include <cstdint>

#include "ops/checks.h"
#include "ops/cpu/reference.h"
#include "ops/cuda/dispatch.h"

namespace kiln::ops {

namespace {

// The logits and offsets both ops take (ops/argmax.h).
void check_ranked(const char* op, const Tensor& logits, const Tensor& offsets) {
  detail::check_matrix(op, "logits", logits, 2, DType::f32);
  KILN_CHECK(logits.shape[1] >= 1, op, ": logits need at least one column, got ", logits.describe());
  KILN_CHECK(logits.shape[1] <= INT32_MAX, op, ": at most 2^31 - 1 columns, got ", logits.describe());
  if (offsets.data != nullptr) {
    detail::check_matrix(op, "offsets", offsets, 1, DType::i64);
    KILN_CHECK(offsets.is_contiguous(), op, ": offsets must be contiguous");
    KILN_CHECK_EQ(offsets.shape[0], logits.shape[1], op, ": offsets vs logits columns");
    detail::check_same_device(op, logits, offsets);
  }
}

}  // namespace

void argmax_rows(const Tensor& logits, const Tensor& offsets, const Tensor& out) {
  constexpr const char* op = "argmax_rows";
  check_ranked(op, logits, offsets);
  detail::check_matrix(op, "out", out, 1, DType::i32);
  KILN_CHECK(out.is_contiguous(), op, ": out must be contiguous");
  KILN_CHECK_EQ(out.shape[0], logits.shape[0], op, ": out rows vs logits rows");
  detail::check_same_device(op, logits, out);
  if (out.device.is_cuda()) return KILN_CUDA_OP(argmax_rows(logits, offsets, out));
  cpu::argmax_rows(logits, offsets, out);
}

void topk_rows(const Tensor& logits, const Tensor& offsets, int k, const Tensor& tokens,
               const Tensor& logprobs) {
  constexpr const char* op = "topk_rows";
  check_ranked(op, logits, offsets);
  KILN_CHECK(k >= 1 && k <= kMaxTopk && k <= logits.shape[1], op, ": k must be in [1, min(", kMaxTopk,
             ", columns)], got ", k, " of ", logits.shape[1], " columns");
  const int64_t R = logits.shape[0];
  const auto check_out = [&](const char* name, const Tensor& t, DType dt) {
    detail::check_matrix(op, name, t, 2, dt);
    KILN_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
    KILN_CHECK(t.shape[0] == R && t.shape[1] == k, op, ": ", name, " must be [", R, ", ", k, "], got ",
               t.describe());
    detail::check_same_device(op, logits, t);
  };
  check_out("tokens", tokens, DType::i32);
  check_out("logprobs", logprobs, DType::f32);
  if (logits.device.is_cuda()) return KILN_CUDA_OP(topk_rows(logits, offsets, k, tokens, logprobs));
  cpu::topk_rows(logits, offsets, k, tokens, logprobs);
}

}  // namespace kiln::ops
