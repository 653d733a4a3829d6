#include "ops/linear.h"

#include "ops/activation.h"
#include "ops/checks.h"
#include "ops/cpu/reference.h"
#include "ops/cuda/dispatch.h"
#include "ops/rms_norm.h"

namespace kiln::ops {

namespace {
// linear's, linear_bias's and linear_f32's arguments: x bf16, weight bf16 (or, where the op takes one,
// block-FP8 with its scales: check_linear_weight); out of out_dtype, [M, N], not aliasing x.
void check_linear(const char* op, const Tensor& x, const LinearWeight& w, const Tensor& out,
                  DType out_dtype) {
  const Tensor& weight = w.weight;
  detail::check_matrix(op, "x", x, 2, DType::bf16);
  check_linear_weight(op, "weight", w);
  detail::check_matrix(op, "out", out, 2, out_dtype);
  KILN_CHECK_EQ(x.shape[1], weight.shape[1], op, ": x ", x.describe(), " vs weight ", weight.describe());
  KILN_CHECK(out.shape[0] == x.shape[0] && out.shape[1] == weight.shape[0], op, ": out ", out.describe(),
             " must be [", x.shape[0], ", ", weight.shape[0], "]");
  KILN_CHECK(out.data != x.data || out.numel() == 0, op, ": out must not alias x");
  detail::check_same_device(op, x, weight);
  detail::check_same_device(op, x, out);
}

// A block-FP8 weight's projection on the CPU: path (a) of ops/fp8_linear.h. (On CUDA each op's CUDA branch
// takes the FP8 weight: ops/cuda/ops_cuda.h.)
void linear_fp8_cpu(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  linear_fp8(x, w, out, Fp8LinearPath::w8a8);
}

#ifdef KILN_HAVE_CUDA
// A weight the fused CUDA branches take (already through check_linear_weight): last stride 1.
bool cuda_weight(const LinearWeight& w) {
  return w.weight.ndim == 2 && w.weight.stride[1] == 1;
}
#endif

}  // namespace

namespace {

// The CUDA engine's tactic rows (returns the previous); a CPU-only build has no CUDA device to ask for.
int64_t set_cuda_tactic_rows(int64_t rows) {
#ifdef KILN_HAVE_CUDA
  return cuda::set_linear_tactic_rows(rows);
#else
  (void)rows;
  return 0;
#endif
}

}  // namespace

LinearTacticRows::LinearTacticRows(Device device, int64_t rows) : device_(device) {
  KILN_CHECK(rows >= 0, "LinearTacticRows: negative rows ", rows);
  if (device_.is_cuda()) prev_ = set_cuda_tactic_rows(rows);
}

LinearTacticRows::~LinearTacticRows() {
  if (device_.is_cuda()) set_cuda_tactic_rows(prev_);
}

void linear(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  if (w.is_fp8() && !x.device.is_cuda()) return linear_fp8_cpu(x, w, out);
  check_linear("linear", x, w, out, DType::bf16);
  if (out.device.is_cuda()) return KILN_CUDA_OP(linear(x, w, out));
  cpu::linear(x, w.weight, out);
}

void linear_bias(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  constexpr const char* op = "linear_bias";
  check_linear(op, x, weight, out, DType::bf16);
  detail::check_matrix(op, "bias", bias, 1, DType::bf16);
  KILN_CHECK(bias.shape[0] == weight.shape[0], op, ": bias ", bias.describe(), " must be [", weight.shape[0],
             "]");
  detail::check_same_device(op, x, bias);
  if (x.device.is_cuda()) return KILN_CUDA_OP(linear_bias(x, weight, bias, out));
  cpu::linear_bias(x, weight, bias, out);
}

void linear_f32(const Tensor& x, const LinearWeight& w, const Tensor& out) {
  if (w.is_fp8()) {
    KILN_CHECK(out.dtype == DType::f32, "linear_f32: out must be f32, got ", out.describe());
    return linear_fp8(x, w, out, Fp8LinearPath::w8a8);
  }
  const Tensor& weight = w.weight;
  check_linear("linear_f32", x, weight, out, DType::f32);
  KILN_CHECK(out.device.is_cpu(), "linear_f32 runs on the CPU only, got ", out.describe());
  cpu::linear_f32(x, weight, out);
}

void linear_silu_mul(const Tensor& x, const LinearWeight& w, const Tensor& gate_up, const Tensor& out) {
  constexpr const char* op = "linear_silu_mul";
  if (w.is_fp8() && !x.device.is_cuda()) {  // the composition, with the FP8 projection's rounding points
    KILN_CHECK(gate_up.data != out.data || out.numel() == 0, op, ": gate_up and out must not alias");
    linear_fp8_cpu(x, w, gate_up);
    return silu_and_mul(gate_up, out);
  }
  const Tensor& weight = w.weight;
  detail::check_matrix(op, "x", x, 2, DType::bf16);
  check_linear_weight(op, "weight", w);
  detail::check_matrix(op, "gate_up", gate_up, 2, DType::bf16);
  detail::check_matrix(op, "out", out, 2, DType::bf16);
  KILN_CHECK_EQ(x.shape[1], weight.shape[1], op, ": x ", x.describe(), " vs weight ", weight.describe());
  KILN_CHECK(weight.shape[0] % 2 == 0, op, ": weight ", weight.describe(), " must be [2 * I, K]");
  KILN_CHECK(gate_up.shape[0] == x.shape[0] && gate_up.shape[1] == weight.shape[0], op, ": gate_up ",
             gate_up.describe(), " must be [", x.shape[0], ", ", weight.shape[0], "]");
  KILN_CHECK(out.shape[0] == x.shape[0] && 2 * out.shape[1] == weight.shape[0], op, ": out ", out.describe(),
             " must be [", x.shape[0], ", ", weight.shape[0] / 2, "]");
  KILN_CHECK((out.data != x.data && out.data != gate_up.data && gate_up.data != x.data) || out.numel() == 0,
             op, ": x, gate_up and out must not alias");
  detail::check_same_device(op, x, weight);
  detail::check_same_device(op, x, gate_up);
  detail::check_same_device(op, x, out);
  if (out.device.is_cuda()) return KILN_CUDA_OP(linear_silu_mul(x, w, gate_up, out));
  cpu::linear(x, weight, gate_up);
  cpu::silu_and_mul(gate_up, out);
}

void linear_add_rms_norm(const Tensor& x, const LinearWeight& w, const Tensor& residual,
                         const Tensor& norm_weight, float eps, const Tensor& tmp, const Tensor& normed) {
  constexpr const char* op = "linear_add_rms_norm";
  if (w.is_fp8() && !x.device.is_cuda()) {  // the composition, with the FP8 projection's rounding points
    linear_fp8_cpu(x, w, tmp);
    return add_rms_norm(tmp, residual, norm_weight, eps, normed);
  }
  const Tensor& weight = w.weight;
  detail::check_matrix(op, "x", x, 2, DType::bf16);
  check_linear_weight(op, "weight", w);
  detail::check_matrix(op, "residual", residual, 2, DType::bf16);
  detail::check_matrix(op, "norm_weight", norm_weight, 1, DType::bf16);
  detail::check_matrix(op, "tmp", tmp, 2, DType::bf16);
  detail::check_matrix(op, "normed", normed, 2, DType::bf16);
  const int64_t M = x.shape[0], N = weight.shape[0];
  KILN_CHECK_EQ(x.shape[1], weight.shape[1], op, ": x ", x.describe(), " vs weight ", weight.describe());
  for (const Tensor* t : {&residual, &tmp, &normed})
    KILN_CHECK(t->shape[0] == M && t->shape[1] == N, op, ": ", t->describe(), " must be [", M, ", ", N, "]");
  KILN_CHECK(norm_weight.shape[0] == N && N > 0, op, ": norm_weight ", norm_weight.describe(), " must be [",
             N, "], N > 0");
  KILN_CHECK(eps > 0.0f, op, ": eps must be positive, got ", eps);
  const void* ptrs[] = {x.data, tmp.data, residual.data, normed.data};
  for (int i = 0; i < 4; ++i)
    for (int j = i + 1; j < 4; ++j)
      KILN_CHECK(ptrs[i] != ptrs[j] || M == 0, op, ": x, tmp, residual and normed must not alias");
  for (const Tensor* t : {&weight, &residual, &norm_weight, &tmp, &normed})
    detail::check_same_device(op, x, *t);
  if (x.device.is_cuda())
    return KILN_CUDA_OP(linear_add_rms_norm(x, w, residual, norm_weight, eps, tmp, normed));
  cpu::linear(x, weight, tmp);
  cpu::add_rms_norm(tmp, residual, norm_weight, eps, normed);
}

void lm_head(const Tensor& x, const Tensor& rows, const Tensor& weight, const Tensor& logits) {
  constexpr const char* op = "lm_head";
  detail::check_matrix(op, "x", x, 2, DType::bf16);
  detail::check_matrix(op, "rows", rows, 1, DType::i32);
  detail::check_matrix(op, "weight", weight, 2, DType::bf16);
  detail::check_matrix(op, "logits", logits, 2, DType::f32);
  KILN_CHECK(rows.is_contiguous(), op, ": rows must be contiguous");
  KILN_CHECK_EQ(x.shape[1], weight.shape[1], op, ": x ", x.describe(), " vs weight ", weight.describe());
  KILN_CHECK(logits.shape[0] == rows.shape[0] && logits.shape[1] == weight.shape[0], op, ": logits ",
             logits.describe(), " must be [", rows.shape[0], ", ", weight.shape[0], "]");
  detail::check_same_device(op, x, rows);
  detail::check_same_device(op, x, weight);
  detail::check_same_device(op, x, logits);
  if (logits.device.is_cuda()) return KILN_CUDA_OP(lm_head(x, rows, weight, logits));
  cpu::lm_head(x, rows, weight, logits);
}

AttnPrepPath linear_attn_prep(const Tensor& x, const LinearWeight& w, const AttnPrepArgs& a) {
  const Tensor& weight = w.weight;
  check_linear_weight("linear_attn_prep", "weight", w);
  KILN_CHECK(x.ndim == 2 && weight.ndim == 2 && a.qkv.ndim == 2 && x.shape[0] == a.qkv.shape[0] &&
                 weight.shape[0] == a.qkv.shape[1] && x.shape[1] == weight.shape[1],
             "linear_attn_prep: x ", x.describe(), " and weight ", weight.describe(), " do not make qkv ",
             a.qkv.describe());
#ifdef KILN_HAVE_CUDA
  // The args are validated once on either path: by attn_prep_params here, else by attn_prep below.
  if (a.qkv.device.is_cuda() && x.dtype == DType::bf16 && cuda_weight(w) && x.device == a.qkv.device &&
      weight.device == a.qkv.device && x.stride[1] == 1 && x.data != a.qkv.data &&
      !attn_prep_unfused_forced() && a.q_norm.data != nullptr &&
      KILN_CUDA_OP(linear_attn_prep_chosen(x.shape[0], weight.shape[0], x.shape[1], w.is_fp8())) &&
      KILN_CUDA_OP(linear_attn_prep(x, w, attn_prep_params(a), a.stream)))
    return AttnPrepPath::cuda_gemv_fused;
#endif
  linear(x, w, a.qkv);
  return attn_prep(a);
}

namespace {

// Validates a ResidualNorm input of K columns against the op's tensor `other` (which none may alias).
void check_residual_norm(const char* op, const ResidualNorm& in, int64_t K, const Tensor& other) {
  detail::check_matrix(op, "delta", in.delta, 2, DType::bf16);
  detail::check_matrix(op, "residual", in.residual, 2, DType::bf16);
  detail::check_matrix(op, "normed", in.normed, 2, DType::bf16);
  detail::check_matrix(op, "norm weight", in.weight, 1, DType::bf16);
  const int64_t M = in.delta.shape[0];
  for (const Tensor* t : {&in.residual, &in.normed})
    KILN_CHECK(t->shape[0] == M && t->shape[1] == K, op, ": ", t->describe(), " must be [", M, ", ", K, "]");
  KILN_CHECK(in.delta.shape[1] == K && in.weight.shape[0] == K, op, ": delta ", in.delta.describe(),
             " and norm weight ", in.weight.describe(), " must have ", K, " columns");
  KILN_CHECK(in.eps > 0.0f, op, ": eps must be positive, got ", in.eps);
  const void* ptrs[] = {in.delta.data, in.residual.data, in.normed.data, other.data};
  for (int i = 0; i < 4; ++i)
    for (int j = i + 1; j < 4; ++j)
      KILN_CHECK(ptrs[i] != ptrs[j] || M == 0, op, ": delta, residual, normed and the output must not alias");
  for (const Tensor* t : {&in.residual, &in.normed, &in.weight}) detail::check_same_device(op, in.delta, *t);
}

}  // namespace

void linear_silu_mul(const ResidualNorm& in, const LinearWeight& w, const Tensor& gate_up,
                     const Tensor& out) {
  const Tensor& weight = w.weight;
  check_linear_weight("linear_silu_mul", "weight", w);
  check_residual_norm("linear_silu_mul", in, weight.ndim == 2 ? weight.shape[1] : -1, out);
  detail::check_same_device("linear_silu_mul", in.delta, out);
#ifdef KILN_HAVE_CUDA
  if (out.device.is_cuda() && cuda_weight(w) && out.ndim == 2 && out.dtype == DType::bf16 &&
      out.stride[1] == 1 && out.shape[0] == in.delta.shape[0] && 2 * out.shape[1] == weight.shape[0] &&
      weight.device == out.device &&
      KILN_CUDA_OP(linear_norm_in(in.delta, in.residual, in.weight, in.eps, w, out, /*silu=*/true)))
    return;
  // Past the GEMV's sizes: the W8A8 GEMM fed by the fused add + norm + quantizer, where it takes gate_up.
  if (out.device.is_cuda() && cuda_weight(w) && gate_up.device == out.device && gate_up.ndim == 2 &&
      gate_up.dtype == DType::bf16 && gate_up.stride[1] == 1 && gate_up.shape[0] == in.delta.shape[0] &&
      gate_up.shape[1] == weight.shape[0] && gate_up.data != out.data &&
      KILN_CUDA_OP(linear_norm_in_fp8(in.delta, in.residual, in.weight, in.eps, w, gate_up)))
    return silu_and_mul(gate_up, out);
#endif
  add_rms_norm(in.delta, in.residual, in.weight, in.eps, in.normed);
  linear_silu_mul(in.normed, w, gate_up, out);
}

AttnPrepPath linear_attn_prep(const ResidualNorm& in, const LinearWeight& w, const AttnPrepArgs& a) {
  const Tensor& weight = w.weight;
  check_linear_weight("linear_attn_prep", "weight", w);
  check_residual_norm("linear_attn_prep", in, weight.ndim == 2 ? weight.shape[1] : -1, a.qkv);
#ifdef KILN_HAVE_CUDA
  if (a.qkv.device.is_cuda() && cuda_weight(w) && a.qkv.ndim == 2 && a.qkv.dtype == DType::bf16 &&
      a.qkv.stride[1] == 1 && a.qkv.shape[0] == in.delta.shape[0] && a.qkv.shape[1] == weight.shape[0] &&
      weight.device == a.qkv.device && in.delta.device == a.qkv.device) {
    // The QKV GEMV fused with the preparation reads x from memory: where it runs, the norm runs first.
    const bool prep_fused =
        !attn_prep_unfused_forced() && KILN_CUDA_OP(linear_attn_prep_chosen(
                                           in.delta.shape[0], weight.shape[0], weight.shape[1], w.is_fp8()));
    if (!prep_fused &&
        (KILN_CUDA_OP(linear_norm_in(in.delta, in.residual, in.weight, in.eps, w, a.qkv, /*silu=*/false)) ||
         KILN_CUDA_OP(linear_norm_in_fp8(in.delta, in.residual, in.weight, in.eps, w, a.qkv))))
      return attn_prep(a);
  }
#endif
  add_rms_norm(in.delta, in.residual, in.weight, in.eps, in.normed);
  return linear_attn_prep(in.normed, w, a);
}

void swiglu_mlp(const ResidualNorm& in, const LinearWeight& gate_up_w, const LinearWeight& down_w,
                const Tensor& gate_up, const Tensor& act, const Tensor& out) {
  constexpr const char* op = "swiglu_mlp";
  check_linear_weight(op, "down weight", down_w);
  detail::check_matrix(op, "out", out, 2, DType::bf16);
  detail::check_matrix(op, "act", act, 2, DType::bf16);
  const int64_t M = in.delta.shape[0];
  KILN_CHECK(out.shape[0] == M && out.shape[1] == down_w.weight.shape[0] && act.shape[0] == M &&
                 act.shape[1] == down_w.weight.shape[1],
             op, ": act ", act.describe(), " and out ", out.describe(), " do not fit down ",
             down_w.weight.describe(), " at M = ", M);
  const void* ptrs[] = {out.data, gate_up.data, act.data, in.residual.data, in.normed.data};
  for (int i = 1; i < 5; ++i) KILN_CHECK(ptrs[0] != ptrs[i] || M == 0, op, ": out aliases another tensor");
  detail::check_same_device(op, out, act);
  detail::check_same_device(op, out, down_w.weight);
#ifdef KILN_HAVE_CUDA
  // The down projection on SiLU-and-multiply's quantized rows: gate_up is then made as linear_silu_mul makes
  // it past the GEMV's sizes (the fused add + norm + quantizer where the W8A8 GEMM takes gate_up too).
  if (out.device.is_cuda() && cuda_weight(down_w) && out.stride[1] == 1 && gate_up.ndim == 2 &&
      gate_up.dtype == DType::bf16 && gate_up.device == out.device && gate_up.stride[1] == 1 &&
      gate_up.shape[0] == M && M > 0 && KILN_CUDA_OP(fp8_prequantized_takes(M, down_w, out))) {
    check_linear_weight(op, "gate_up weight", gate_up_w);
    check_residual_norm(op, in, gate_up_w.weight.shape[1], gate_up);
    if (!(cuda_weight(gate_up_w) &&
          KILN_CUDA_OP(linear_norm_in_fp8(in.delta, in.residual, in.weight, in.eps, gate_up_w, gate_up)))) {
      add_rms_norm(in.delta, in.residual, in.weight, in.eps, in.normed);
      linear(in.normed, gate_up_w, gate_up);
    }
    if (KILN_CUDA_OP(silu_mul_linear_fp8(gate_up, down_w, out))) return;
    silu_and_mul(gate_up, act);  // the workspace would grow inside a graph capture: the unfused ops
    return linear(act, down_w, out);
  }
#endif
  linear_silu_mul(in, gate_up_w, gate_up, act);
  linear(act, down_w, out);
}

}  // namespace kiln::ops
