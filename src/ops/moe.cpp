#include "ops/moe.h"

#include <cstdint>

#include "ops/checks.h"
#include "ops/cpu/moe.h"
#include "ops/fp8_linear.h"
#include "ops/rms_norm.h"

#ifdef KILN_HAVE_CUDA
#include "ops/cuda/moe_ops.h"
#endif

namespace kiln::ops {
namespace {

#ifdef KILN_HAVE_CUDA
bool al16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
}
#endif

constexpr const char* kNoCuda = "kiln was built without CUDA: MoE layers run on the CPU backend";

void check_route(const char* op, const Tensor& logits, int64_t top_k, const Tensor& experts,
                 const Tensor& weights) {
  detail::check_matrix(op, "logits", logits, 2, DType::bf16);
  detail::check_matrix(op, "experts", experts, 2, DType::i32);
  detail::check_matrix(op, "weights", weights, 2, DType::bf16);
  const int64_t T = logits.shape[0], E = logits.shape[1];
  KILN_CHECK(top_k >= 1 && top_k <= E, op, ": top_k ", top_k, " outside [1, ", E, "] (the expert count)");
  for (const Tensor* t : {&experts, &weights})
    KILN_CHECK(t->shape[0] == T && t->shape[1] == top_k && t->is_contiguous(), op, ": ", t->describe(),
               " must be contiguous [", T, ", ", top_k, "]");
  detail::check_same_device(op, logits, experts);
  detail::check_same_device(op, logits, weights);
}

}  // namespace

void moe_route(const Tensor& logits, int64_t top_k, bool norm_topk_prob, const Tensor& experts,
               const Tensor& weights) {
  constexpr const char* op = "moe_route";
  check_route(op, logits, top_k, experts, weights);
  if (logits.device.is_cuda()) {
#ifdef KILN_HAVE_CUDA
    KILN_CHECK(logits.shape[1] <= 512, op, ": ", logits.shape[1],
               " experts; the CUDA routing kernel takes at most 512");
    cuda::moe_route(logits, top_k, norm_topk_prob, experts, weights);
    return;
#else
    KILN_FAIL(op, ": ", kNoCuda);
#endif
  }
  cpu::moe_route(logits, top_k, norm_topk_prob, experts, weights);
}

namespace {

// Block-FP8 experts (ops/moe.h): per-expert 128 x 128 block scales, each expert's gate, up and down rows
// whole blocks so one expert's scales never share a block with another's or gate's with up's.
void check_fp8_scales(const char* op, const MoeWeights& w, int64_t H, int64_t I, int64_t L) {
  KILN_CHECK(I % kFp8Block == 0 && H % kFp8Block == 0, op, ": block-FP8 experts need moe_intermediate_size (",
             I, ") and hidden_size (", H, ") multiples of 128 (gate and up rows in separate 128-row blocks)");
  const int64_t gr = 2 * I / kFp8Block, gc = fp8_blocks(H), dr = H / kFp8Block, dc = fp8_blocks(I);
  KILN_CHECK(w.gate_up_scale.dtype == DType::f32 && w.gate_up_scale.ndim == 3 &&
                 w.gate_up_scale.shape[0] == L && w.gate_up_scale.shape[1] == gr &&
                 w.gate_up_scale.shape[2] == gc && w.gate_up_scale.is_contiguous(),
             op, ": gate_up_scale ", w.gate_up_scale.describe(), " must be contiguous f32 [", L, ", ", gr,
             ", ", gc, "]");
  KILN_CHECK(w.down_scale.dtype == DType::f32 && w.down_scale.ndim == 3 && w.down_scale.shape[0] == L &&
                 w.down_scale.shape[1] == dr && w.down_scale.shape[2] == dc && w.down_scale.is_contiguous(),
             op, ": down_scale ", w.down_scale.describe(), " must be contiguous f32 [", L, ", ", dr, ", ", dc,
             "]");
  detail::check_same_device(op, w.gate_up, w.gate_up_scale);
  detail::check_same_device(op, w.gate_up, w.down_scale);
}

void check_mlp(const char* op, const Tensor& x, const MoeWeights& w, const Tensor& out) {
  detail::check_matrix(op, "x", x, 2, DType::bf16);
  detail::check_matrix(op, "out", out, 2, out.dtype == DType::f32 ? DType::f32 : DType::bf16);
  detail::check_matrix(op, "router", w.router, 2, DType::bf16);
  const DType wt = w.is_fp8() ? DType::f8e4m3 : DType::bf16;
  detail::check_matrix(op, "gate_up", w.gate_up, 3, wt);
  detail::check_matrix(op, "down", w.down, 3, wt);
  const int64_t H = x.shape[1], E = w.router.shape[0], I = w.gate_up.shape[1] / 2, L = w.gate_up.shape[0];
  KILN_CHECK(out.shape[0] == x.shape[0] && out.shape[1] == H, op, ": out ", out.describe(), " vs x ",
             x.describe());
  KILN_CHECK(out.data != x.data || x.numel() == 0, op, ": out must not alias x");
  KILN_CHECK(w.router.shape[1] == H, op, ": router ", w.router.describe(), " must be [E, ", H, "]");
  KILN_CHECK(w.expert_begin >= 0 && L >= 1 && w.expert_begin + L <= E, op, ": experts [", w.expert_begin,
             ", ", w.expert_begin + L, ") outside the router's [0, ", E, ")");
  KILN_CHECK(w.gate_up.shape[1] == 2 * I && w.gate_up.shape[2] == H && w.gate_up.is_contiguous(), op,
             ": gate_up ", w.gate_up.describe(), " must be contiguous [", L, ", ", 2 * I, ", ", H, "]");
  KILN_CHECK(w.down.shape[0] == L && w.down.shape[1] == H && w.down.shape[2] == I && w.down.is_contiguous(),
             op, ": down ", w.down.describe(), " must be contiguous [", L, ", ", H, ", ", I, "]");
  KILN_CHECK(w.top_k >= 1 && w.top_k <= E, op, ": top_k ", w.top_k, " outside [1, ", E, "]");
  for (const Tensor* t : {&out, &w.router, &w.gate_up, &w.down}) detail::check_same_device(op, x, *t);
  if (w.is_fp8()) check_fp8_scales(op, w, H, I, L);
  KILN_CHECK(out.dtype == DType::bf16 || out.is_contiguous(), op, ": an f32 out must be contiguous, got ",
             out.describe());
}

}  // namespace

int64_t moe_scratch_bytes(const MoeWeights& w, int64_t hidden, int64_t tokens, Device device) {
  KILN_CHECK(tokens >= 0 && hidden >= 0, "moe_scratch_bytes: negative size");
  if (!device.is_cuda() || !w.present()) return 0;
#ifdef KILN_HAVE_CUDA
  return int64_t(cuda::moe_scratch_bytes(w, hidden, tokens));
#else
  KILN_FAIL("moe_scratch_bytes: ", kNoCuda);
#endif
}

void moe_mlp(const Tensor& x, const MoeWeights& w, const Tensor& out, MoeFp8Path fp8) {
  constexpr const char* op = "moe_mlp";
  check_mlp(op, x, w, out);
  KILN_CHECK(!x.device.is_cuda(), op, ": on CUDA it needs its scratch (moe_mlp with a scratch tensor)");
  cpu::moe_mlp(x, w, out, fp8);
}

namespace {

#ifdef KILN_HAVE_CUDA
// The CUDA path's own limits, after check_mlp.
void check_cuda_mlp(const char* op, const Tensor& x, const MoeWeights& w, const Tensor& out,
                    const Tensor& scratch) {
  const int64_t need = moe_scratch_bytes(w, x.shape[1], x.shape[0], x.device);
  KILN_CHECK(scratch.device == x.device && scratch.is_contiguous() && scratch.nbytes() >= need, op,
             ": scratch ", scratch.describe(), " must be a contiguous device buffer of at least ", need,
             " bytes (moe_scratch_bytes) for ", x.shape[0], " tokens");
  KILN_CHECK(w.num_experts() <= 512, op, ": ", w.num_experts(),
             " experts; the CUDA routing kernel takes at most 512");
  KILN_CHECK(out.dtype == DType::bf16, op,
             ": an f32 partial (the fp32 all-reduce) runs on the CPU backend only; CUDA writes bf16 out");
  KILN_CHECK(x.shape[1] % 8 == 0 && w.intermediate() % 8 == 0, op, ": hidden ", x.shape[1],
             " and moe_intermediate_size ", w.intermediate(),
             " must be multiples of 8 for the CUDA expert kernels (16-byte rows)");
  KILN_CHECK(
      al16(x) && al16(out) && al16(w.gate_up) && al16(w.down) && al16(w.router) && x.stride[0] % 8 == 0 &&
          out.stride[0] % 8 == 0 && w.router.is_contiguous(),
      op,
      ": x, out, the router and the expert weights must be 16-byte aligned, x and out with row strides "
      "a multiple of 8, the router contiguous");
}
#endif

}  // namespace

void moe_mlp(const Tensor& x, const MoeWeights& w, const Tensor& out, const Tensor& scratch) {
  constexpr const char* op = "moe_mlp";
  check_mlp(op, x, w, out);
  if (!x.device.is_cuda()) return cpu::moe_mlp(x, w, out);
#ifdef KILN_HAVE_CUDA
  check_cuda_mlp(op, x, w, out, scratch);
  cuda::moe_mlp(x, w, out, scratch.data, size_t(scratch.nbytes()));
#else
  (void)scratch;
  KILN_FAIL(op, ": ", kNoCuda);
#endif
}

void moe_mlp(const ResidualNorm& in, const MoeWeights& w, const Tensor& out, const Tensor& scratch) {
  constexpr const char* op = "moe_mlp";
  check_mlp(op, in.normed, w, out);
  const int64_t T = in.normed.shape[0], H = in.normed.shape[1];
  detail::check_matrix(op, "delta", in.delta, 2, DType::bf16);
  detail::check_matrix(op, "residual", in.residual, 2, DType::bf16);
  detail::check_matrix(op, "norm weight", in.weight, 1, DType::bf16);
  for (const Tensor* t : {&in.delta, &in.residual})
    KILN_CHECK(t->shape[0] == T && t->shape[1] == H, op, ": ", t->describe(), " must be [", T, ", ", H, "]");
  KILN_CHECK(in.weight.shape[0] == H, op, ": norm weight ", in.weight.describe(), " must be [", H, "]");
  KILN_CHECK(in.eps > 0.0f, op, ": eps must be positive, got ", in.eps);
  KILN_CHECK(T == 0 || (in.delta.data != in.residual.data && in.delta.data != in.normed.data &&
                        in.residual.data != in.normed.data && out.data != in.residual.data),
             op, ": delta, residual and normed must not alias one another, nor out residual");
  for (const Tensor* t : {&in.delta, &in.residual, &in.weight}) detail::check_same_device(op, in.normed, *t);
#ifdef KILN_HAVE_CUDA
  if (in.normed.device.is_cuda() && cuda::moe_norm_in_applies(T, H) && al16(in.delta) && al16(in.residual) &&
      al16(in.weight) && in.delta.stride[0] % 8 == 0 && in.residual.stride[0] % 8 == 0) {
    check_cuda_mlp(op, in.normed, w, out, scratch);
    cuda::moe_mlp_norm_in(&in, in.normed, w, out, scratch.data, size_t(scratch.nbytes()));
    return;
  }
#endif
  add_rms_norm(in.delta, in.residual, in.weight, in.eps, in.normed);  // reads delta before out is written
  moe_mlp(in.normed, w, out, scratch);
}

}  // namespace kiln::ops
