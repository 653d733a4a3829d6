#include "ops/activation.h"

#include "ops/checks.h"
#include "ops/cpu/reference.h"
#include "ops/cuda/dispatch.h"

namespace kiln::ops {

void silu_and_mul(const Tensor& gate_up, const Tensor& out) {
  constexpr const char* op = "silu_and_mul";
  detail::check_matrix(op, "gate_up", gate_up, 2, DType::bf16);
  detail::check_matrix(op, "out", out, 2, DType::bf16);
  KILN_CHECK(out.shape[0] == gate_up.shape[0] && gate_up.shape[1] == 2 * out.shape[1], op, ": gate_up ",
             gate_up.describe(), " must be [M, 2 * I] for out ", out.describe());
  detail::check_same_device(op, gate_up, out);
  if (out.device.is_cuda()) return KILN_CUDA_OP(silu_and_mul(gate_up, out));
  cpu::silu_and_mul(gate_up, out);
}

void gelu(const Tensor& x, const Tensor& out, GeluApprox approx) {
  constexpr const char* op = "gelu";
  detail::check_matrix(op, "x", x, 2, DType::bf16);
  detail::check_matrix(op, "out", out, 2, DType::bf16);
  KILN_CHECK(out.shape[0] == x.shape[0] && out.shape[1] == x.shape[1], op, ": out ", out.describe(), " vs x ",
             x.describe());
  detail::check_same_device(op, x, out);
  if (x.device.is_cuda()) return KILN_CUDA_OP(gelu(x, out, approx == GeluApprox::tanh));
  cpu::gelu(x, out, approx == GeluApprox::tanh);
}

}  // namespace kiln::ops
