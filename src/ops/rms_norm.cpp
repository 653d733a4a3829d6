#include "ops/rms_norm.h"

#include "ops/checks.h"
#include "ops/cpu/reference.h"
#include "ops/cuda/dispatch.h"

namespace kiln::ops {
namespace {

void check_norm(const char* op, const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  detail::check_matrix(op, "x", x, 2, DType::bf16);
  detail::check_matrix(op, "out", out, 2, DType::bf16);
  detail::check_matrix(op, "weight", weight, 1, DType::bf16);
  KILN_CHECK(out.shape[0] == x.shape[0] && out.shape[1] == x.shape[1], op, ": out ", out.describe(), " vs x ",
             x.describe());
  KILN_CHECK_EQ(weight.shape[0], x.shape[1], op, ": weight size vs hidden size");
  KILN_CHECK(x.shape[1] > 0, op, ": empty hidden size");
  KILN_CHECK(eps > 0.0f, op, ": eps must be positive, got ", eps);
  detail::check_same_device(op, x, weight);
  detail::check_same_device(op, x, out);
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  check_norm("rms_norm", x, weight, eps, out);
  if (out.device.is_cuda()) return KILN_CUDA_OP(rms_norm(x, weight, eps, out));
  cpu::rms_norm(x, weight, eps, out);
}

void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                  const Tensor& out) {
  check_norm("add_rms_norm", x, weight, eps, out);
  detail::check_matrix("add_rms_norm", "residual", residual, 2, DType::bf16);
  KILN_CHECK(residual.shape[0] == x.shape[0] && residual.shape[1] == x.shape[1], "add_rms_norm: residual ",
             residual.describe(), " vs x ", x.describe());
  KILN_CHECK(out.data != x.data && out.data != residual.data,
             "add_rms_norm: out must not alias x or residual");
  detail::check_same_device("add_rms_norm", x, residual);
  if (out.device.is_cuda()) return KILN_CUDA_OP(add_rms_norm(x, residual, weight, eps, out));
  cpu::add_rms_norm(x, residual, weight, eps, out);
}

}  // namespace kiln::ops
