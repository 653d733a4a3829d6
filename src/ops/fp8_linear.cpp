#include "ops/fp8_linear.h"

#include "ops/checks.h"
#include "ops/cpu/fp8_ref.h"
#ifdef KILN_HAVE_CUDA
#include "ops/cuda/fp8_dequant.h"
#endif

namespace kiln::ops {

void check_linear_weight(const char* op, const char* name, const LinearWeight& w) {
  KILN_CHECK(w.weight.dtype == DType::bf16 || w.weight.dtype == DType::f8e4m3, op, ": ", name,
             " must be bf16 or f8e4m3, got ", w.weight.describe());
  detail::check_matrix(op, name, w.weight, 2, w.weight.dtype);
  if (!w.is_fp8()) {
    KILN_CHECK(w.scale.data == nullptr, op, ": ", name, " is bf16 but carries block scales ",
               w.scale.describe());
    return;
  }
  KILN_CHECK(w.scale.data != nullptr, op, ": ", name, " is f8e4m3 but has no block scales");
  detail::check_matrix(op, "block scales", w.scale, 2, DType::f32);
  const int64_t nb = fp8_blocks(w.rows()), kb = fp8_blocks(w.cols());
  KILN_CHECK(w.scale.shape[0] == nb && w.scale.shape[1] == kb && w.scale.is_contiguous(), op, ": ", name, " ",
             w.weight.describe(), " needs contiguous block scales f32[", nb, ", ", kb, "], got ",
             w.scale.describe());
  detail::check_same_device(op, w.weight, w.scale);
}

namespace {

// linear_fp8's argument checks (and linear_fp8_chunk16's), naming `op`.
void check_fp8_call(const char* op, const Tensor& x, const LinearWeight& w, const Tensor& out) {
  check_linear_weight(op, "weight", w);
  KILN_CHECK(w.is_fp8(), op, ": weight must be f8e4m3, got ", w.weight.describe());
  detail::check_matrix(op, "x", x, 2, DType::bf16);
  detail::check_matrix(op, "out", out, 2, out.dtype == DType::f32 ? DType::f32 : DType::bf16);
  KILN_CHECK_EQ(x.shape[1], w.cols(), op, ": x ", x.describe(), " vs weight ", w.weight.describe());
  KILN_CHECK(out.shape[0] == x.shape[0] && out.shape[1] == w.rows(), op, ": out ", out.describe(),
             " must be [", x.shape[0], ", ", w.rows(), "]");
  KILN_CHECK(out.data != x.data || out.numel() == 0, op, ": out must not alias x");
  detail::check_same_device(op, x, w.weight);
  detail::check_same_device(op, x, out);
  KILN_CHECK(x.device.is_cpu(), op,
             ": runs on the CPU only (the CUDA backend dequantizes block-FP8 weights at load), got ",
             x.describe());
}

}  // namespace

void linear_fp8(const Tensor& x, const LinearWeight& w, const Tensor& out, Fp8LinearPath path) {
  check_fp8_call("linear_fp8", x, w, out);
  if (path == Fp8LinearPath::w8a8) return cpu::linear_fp8_w8a8(x, w.weight, w.scale, out);
  cpu::linear_fp8_weight_only(x, w.weight, w.scale, out);
}

void linear_fp8_chunk16(const Tensor& x, const LinearWeight& w, const Tensor& out, int threads) {
  constexpr const char* op = "linear_fp8_chunk16";
  KILN_CHECK(threads >= 32 && threads % 32 == 0, op, ": threads must be a positive multiple of 32, got ",
             threads);
  check_fp8_call(op, x, w, out);
  KILN_CHECK(w.cols() % 16 == 0, op, ": K must be a multiple of 16, got ", w.weight.describe());
  cpu::linear_fp8_chunk16(x, w.weight, w.scale, out, threads);
}

void quantize_act_fp8(const Tensor& x, const Tensor& q, const Tensor& scale) {
  constexpr const char* op = "quantize_act_fp8";
  detail::check_matrix(op, "x", x, 2, DType::bf16);
  detail::check_matrix(op, "q", q, 2, DType::f8e4m3);
  detail::check_matrix(op, "scale", scale, 2, DType::f32);
  const int64_t M = x.shape[0], K = x.shape[1];
  KILN_CHECK(q.shape[0] == M && q.shape[1] == K, op, ": q ", q.describe(), " must be [", M, ", ", K, "]");
  KILN_CHECK(scale.shape[0] == M && scale.shape[1] == fp8_blocks(K) && scale.is_contiguous(), op, ": scale ",
             scale.describe(), " must be contiguous [", M, ", ", fp8_blocks(K), "]");
  for (const Tensor* t : {&x, &q, &scale})
    KILN_CHECK(t->device.is_cpu(), op, ": runs on the CPU only, got ", t->describe());
  cpu::quantize_act_fp8(x, q, scale);
}

void quantize_weight_fp8(const Tensor& w, const Tensor& q, const Tensor& scale, const std::string& name) {
  constexpr const char* op = "quantize_weight_fp8";
  detail::check_matrix(op, "w", w, 2, DType::bf16);
  detail::check_matrix(op, "q", q, 2, DType::f8e4m3);
  detail::check_matrix(op, "scale", scale, 2, DType::f32);
  const int64_t N = w.shape[0], K = w.shape[1];
  KILN_CHECK(w.is_contiguous() && q.is_contiguous() && scale.is_contiguous(), op,
             ": w, q and scale must be contiguous");
  KILN_CHECK(q.shape[0] == N && q.shape[1] == K, op, ": q ", q.describe(), " must be [", N, ", ", K, "]");
  KILN_CHECK(scale.shape[0] == fp8_blocks(N) && scale.shape[1] == fp8_blocks(K), op, ": scale ",
             scale.describe(), " must be [", fp8_blocks(N), ", ", fp8_blocks(K), "]");
  for (const Tensor* t : {&w, &q, &scale})
    KILN_CHECK(t->device.is_cpu(), op, ": runs on the CPU only, got ", t->describe());
  cpu::quantize_weight_fp8(w, q, scale, name);
}

void dequantize_fp8(const LinearWeight& w, const Tensor& out) {
  constexpr const char* op = "dequantize_fp8";
  check_linear_weight(op, "weight", w);
  KILN_CHECK(w.is_fp8(), op, ": weight must be f8e4m3, got ", w.weight.describe());
  detail::check_matrix(op, "out", out, 2, DType::bf16);
  KILN_CHECK(out.shape[0] == w.rows() && out.shape[1] == w.cols() && out.is_contiguous(), op, ": out ",
             out.describe(), " must be contiguous [", w.rows(), ", ", w.cols(), "]");
  detail::check_same_device(op, w.weight, out);
  if (out.device.is_cuda()) {
#ifdef KILN_HAVE_CUDA
    return cuda::dequantize_fp8(w.weight, w.scale, out);
#else
    KILN_FAIL(op, ": kiln was built without CUDA");
#endif
  }
  cpu::dequantize_fp8(w.weight, w.scale, out);
}

}  // namespace kiln::ops
