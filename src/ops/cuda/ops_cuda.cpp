// Tensor views -> raw CUDA launches (see ops_cuda.h).
#include "ops/cuda/ops_cuda.h"

#include <cstdint>

#include "ops/cuda/argmax.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/context.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/fp8_act_producers.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/gemv_attn_prep.h"
#include "ops/cuda/gemv_w8a8.h"

namespace kiln::ops::cuda {
namespace kc = ::kiln::cuda;

namespace {

bool al16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// A LinearWeight as the GEMV's weight (gemv.h: GemvWeight): its matrix and, for block-FP8, its scales.
kc::GemvWeight gemv_weight(const LinearWeight& w) {
  return {w.weight.data, w.weight.stride[0], w.is_fp8() ? w.scale.ptr<float>() : nullptr};
}

kc::GemmWeight gemm_weight(const LinearWeight& w) {
  return w.is_fp8() ? kc::GemmWeight::fp8 : kc::GemmWeight::bf16;
}

// The alignment the GEMV forms need of W (gemv.h: GemvWeight).
bool weight_aligned(const kc::GemvWeight& w) {
  return w.is_fp8()
             ? reinterpret_cast<uintptr_t>(w.data) % 8 == 0 && reinterpret_cast<uintptr_t>(w.scale) % 4 == 0
             : al16(w.data);
}

}  // namespace

void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  kc::embedding_gather(ids.ptr<int32_t>(), table.data, table.stride[0], out.data, out.stride[0],
                       out.dtype == DType::f32, ids.shape[0], table.shape[0], table.shape[1],
                       kc::current_stream(), kc::pdl_for(kc::PdlSite::elementwise));
}

void argmax_rows(const Tensor& logits, const Tensor& offsets, const Tensor& out) {
  kc::argmax_rows(logits.ptr<float>(), logits.stride[0], logits.shape[0], logits.shape[1],
                  offsets.data ? offsets.ptr<int64_t>() : nullptr, out.ptr<int32_t>(), kc::current_stream(),
                  kc::pdl_for(kc::PdlSite::elementwise));
}

void topk_rows(const Tensor& logits, const Tensor& offsets, int k, const Tensor& tokens,
               const Tensor& logprobs) {
  kc::topk_rows(logits.ptr<float>(), logits.stride[0], logits.shape[0], logits.shape[1],
                offsets.data ? offsets.ptr<int64_t>() : nullptr, k, tokens.ptr<int32_t>(),
                logprobs.ptr<float>(), kc::current_stream(), kc::pdl_for(kc::PdlSite::elementwise));
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  kc::rms_norm(x.data, x.stride[0], nullptr, 0, weight.data, out.data, out.stride[0], x.shape[0], x.shape[1],
               eps,
               /*add=*/false, kc::current_stream(), kc::pdl_for(kc::PdlSite::elementwise));
}

void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, float eps,
                  const Tensor& out) {
  kc::rms_norm(x.data, x.stride[0], residual.data, residual.stride[0], weight.data, out.data, out.stride[0],
               x.shape[0], x.shape[1], eps, /*add=*/true, kc::current_stream(),
               kc::pdl_for(kc::PdlSite::elementwise));
}

void silu_and_mul(const Tensor& gate_up, const Tensor& out) {
  kc::silu_mul(gate_up.data, gate_up.stride[0], out.data, out.stride[0], out.shape[0], out.shape[1],
               kc::current_stream(), kc::pdl_for(kc::PdlSite::elementwise));
}

void linear(const Tensor& x, const LinearWeight& weight, const Tensor& out) {
  if (x.shape[0] == 0) return;
  kc::gemm_engine().run(x.data, x.stride[0], gemv_weight(weight), out.data, out.stride[0], x.shape[0],
                        weight.rows(), x.shape[1], kc::GemmOut::bf16, kc::current_stream(),
                        kc::pdl_for(kc::PdlSite::gemv));
}

void linear_silu_mul(const Tensor& x, const LinearWeight& weight, const Tensor& gate_up, const Tensor& out) {
  const int64_t M = x.shape[0], N = weight.rows(), K = x.shape[1];
  if (M == 0) return;
  kc::GemmEngine& eng = kc::gemm_engine();
  const kc::GemvWeight w = gemv_weight(weight);
  // The tuned GEMV (W8A16 or W8A8) where it takes the call (gemv.h: gemv_takes).
  if (const auto g = eng.gemv_choice(M, N, K, kc::GemmOut::bf16, gemm_weight(weight));
      g && kc::gemv_takes(*g, x.data, x.stride[0], w, out.data, out.stride[0], M, N, K,
                          kc::GemvEpilogue::silu_mul)) {
    kc::gemv(x.data, x.stride[0], w, out.data, out.stride[0], M, N, K, kc::GemvEpilogue::silu_mul, *g,
             kc::current_stream(), kc::pdl_for(kc::PdlSite::gemv));
    return;
  }
  linear(x, weight, gate_up);
  silu_and_mul(gate_up, out);
}

void linear_add_rms_norm(const Tensor& x, const LinearWeight& weight, const Tensor& residual,
                         const Tensor& norm_weight, float eps, const Tensor& tmp, const Tensor& normed) {
  const int64_t M = x.shape[0], N = weight.rows(), K = x.shape[1];
  if (M == 0) return;
  // The fused epilogue only when switched on (GemmEngine::set_gemv_add_rms_norm): it measured slower.
  kc::GemmEngine& eng = kc::gemm_engine();
  const kc::GemvWeight w = gemv_weight(weight);
  if (const auto g = eng.gemv_add_rms_norm()
                         ? eng.gemv_choice(M, N, K, kc::GemmOut::bf16, gemm_weight(weight))
                         : std::nullopt;
      g && kc::gemv_fusable(*g) && al16(x.data) && weight_aligned(w) && kc::gemv_weight_fits(*g, w, K) &&
      al16(tmp.data) && al16(residual.data) && al16(norm_weight.data) && al16(normed.data) &&
      kc::gemv_add_rms_norm_supported(M, N, K, x.stride[0], w.ld, tmp.stride[0], residual.stride[0],
                                      normed.stride[0])) {
    kc::gemv_add_rms_norm(x.data, x.stride[0], w, tmp.data, tmp.stride[0], residual.data, residual.stride[0],
                          norm_weight.data, normed.data, normed.stride[0], M, N, K, eps, *g,
                          kc::current_stream(), kc::pdl_for(kc::PdlSite::gemv));
    return;
  }
  linear(x, weight, tmp);
  add_rms_norm(tmp, residual, norm_weight, eps, normed);
}

bool linear_norm_in(const Tensor& delta, const Tensor& residual, const Tensor& norm_weight, float eps,
                    const LinearWeight& weight, const Tensor& out, bool silu) {
  const int64_t M = delta.shape[0], N = weight.rows(), K = weight.cols();
  if (M == 0) return false;
  const auto g = kc::gemm_engine().gemv_norm_in_choice(M, N, K, gemm_weight(weight));
  const kc::GemvWeight w = gemv_weight(weight);
  const kc::GemvEpilogue epi = silu ? kc::GemvEpilogue::silu_mul : kc::GemvEpilogue::bf16;
  if (!g || !al16(delta.data) || !al16(residual.data) || !al16(norm_weight.data) || !al16(out.data))
    return false;
  // The W8A8 GEMV's prologue (gemv_w8a8.h) or the W8A16 / bf16 one (gemv.h), each with its own guards.
  if (g->w8a8 != 0
          ? !al16(w.data) || !kc::gemv_w8a8_norm_in_supported(M, N, K, delta.stride[0], residual.stride[0],
                                                              w.ld, out.stride[0], epi)
          : !weight_aligned(w) || !kc::gemv_weight_fits(*g, w, K) ||
                !kc::gemv_norm_in_supported(M, N, K, delta.stride[0], residual.stride[0], w.ld, out.stride[0],
                                            epi))
    return false;
  kc::gemv_norm_in(delta.data, delta.stride[0], residual.data, residual.stride[0], norm_weight.data, eps, w,
                   out.data, out.stride[0], M, N, K, epi, *g, kc::current_stream(),
                   kc::pdl_for(kc::PdlSite::gemv));
  return true;
}

bool fp8_prequantized_takes(int64_t m, const LinearWeight& weight, const Tensor& out) {
  return weight.is_fp8() && kc::gemm_engine().fp8_gemm_takes(gemv_weight(weight), out.data, out.stride[0], m,
                                                             weight.rows(), weight.cols());
}

bool linear_norm_in_fp8(const Tensor& delta, const Tensor& residual, const Tensor& norm_weight, float eps,
                        const LinearWeight& weight, const Tensor& out) {
  const int64_t M = delta.shape[0], N = weight.rows(), K = weight.cols();
  if (!fp8_prequantized_takes(M, weight, out) || !al16(delta.data) || !al16(residual.data) ||
      !al16(norm_weight.data) || delta.stride[0] % 8 != 0 || residual.stride[0] % 8 != 0)
    return false;
  kc::GemmEngine& eng = kc::gemm_engine();
  const kc::GemvWeight w = gemv_weight(weight);
  const auto ws = eng.fp8_gemm_input(w, out.data, out.stride[0], M, N, K, kc::current_stream());
  if (!ws.data) return false;
  kc::rms_norm_quantize_act(delta.data, delta.stride[0], residual.data, residual.stride[0], norm_weight.data,
                            /*out=*/nullptr, 0, M, K, eps, /*add=*/true, ws.data, ws.bytes,
                            kc::current_stream());
  eng.run_prequantized(w, out.data, out.stride[0], M, N, K, kc::current_stream());
  return true;
}

bool silu_mul_linear_fp8(const Tensor& gate_up, const LinearWeight& weight, const Tensor& out) {
  const int64_t M = gate_up.shape[0], N = weight.rows(), I = weight.cols();
  if (!fp8_prequantized_takes(M, weight, out) || gate_up.shape[1] != 2 * I || !al16(gate_up.data) ||
      gate_up.stride[0] % 8 != 0)
    return false;
  kc::GemmEngine& eng = kc::gemm_engine();
  const kc::GemvWeight w = gemv_weight(weight);
  const auto ws = eng.fp8_gemm_input(w, out.data, out.stride[0], M, N, I, kc::current_stream());
  if (!ws.data) return false;
  kc::silu_mul_quantize_act(gate_up.data, gate_up.stride[0], M, I, ws.data, ws.bytes, kc::current_stream());
  eng.run_prequantized(w, out.data, out.stride[0], M, N, I, kc::current_stream());
  return true;
}

void reserve_fp8_dequant(int64_t elements) {
  kc::gemm_engine().reserve_fp8_dequant(elements);
}

void reserve_fp8_gemm(int64_t m, int64_t k) {
  kc::gemm_engine().reserve_fp8_gemm(m, k);
}

bool linear_attn_prep_chosen(int64_t m, int64_t n, int64_t k, bool fp8_weight) {
  const kc::GemmEngine& eng = kc::gemm_engine();
  if (m < 1 || !eng.gemv_attn_prep()) return false;
  const auto g =
      eng.gemv_choice(m, n, k, kc::GemmOut::bf16, fp8_weight ? kc::GemmWeight::fp8 : kc::GemmWeight::bf16);
  return g && kc::gemv_fusable(*g);
}

bool linear_attn_prep(const Tensor& x, const LinearWeight& weight, const kc::AttnPrepParams& p,
                      void* stream) {
  const int64_t M = x.shape[0], N = weight.rows(), K = x.shape[1];
  kc::GemmEngine& eng = kc::gemm_engine();
  if (M == 0 || !eng.gemv_attn_prep()) return false;
  // The tuner's GEMV config for the QKV shape: the one linear() would run, so the rows are bitwise its rows.
  const auto g = eng.gemv_choice(M, N, K, kc::GemmOut::bf16, gemm_weight(weight));
  const kc::GemvWeight w = gemv_weight(weight);
  if (!g || !kc::gemv_fusable(*g) || !kc::gemv_weight_fits(*g, w, K) ||
      !kc::gemv_attn_prep_supported(M, K, x.data, x.stride[0], w, p))
    return false;
  kc::gemv_attn_prep(x.data, x.stride[0], w, M, K, p, *g, static_cast<cudaStream_t>(stream),
                     kc::pdl_for(kc::PdlSite::gemv));
  return true;
}

void lm_head(const Tensor& x, const Tensor& rows, const Tensor& weight, const Tensor& logits) {
  const int64_t R = rows.shape[0], H = x.shape[1], V = weight.shape[0];
  if (R == 0) return;
  const int64_t ldg = (H + 7) / 8 * 8;
  void* gathered = kc::scratch(size_t(R * ldg) * 2);
  // The row gather is an embedding lookup into the hidden-state matrix (rows were range-checked upstream).
  kc::embedding_gather(rows.ptr<int32_t>(), x.data, x.stride[0], gathered, ldg, false, R, x.shape[0], H,
                       kc::current_stream(), kc::pdl_for(kc::PdlSite::lm_head));
  kc::gemm_engine().run(gathered, ldg, weight.data, weight.stride[0], logits.data, logits.stride[0], R, V, H,
                        kc::GemmOut::f32, kc::current_stream(), kc::pdl_for(kc::PdlSite::lm_head));
  kc::round_f32_to_bf16(logits.ptr<float>(), R, V, logits.stride[0], kc::current_stream(),
                        kc::pdl_for(kc::PdlSite::lm_head));
}

int64_t set_linear_tactic_rows(int64_t rows) {
  kc::GemmEngine& eng = kc::gemm_engine();
  const int64_t prev = eng.tactic_rows();
  eng.set_tactic_rows(rows);
  return prev;
}

void paged_attention(const PagedAttentionArgs& a) {
  const KvCacheView& c = a.cache;
  KILN_CHECK(c.k.dtype == DType::bf16 || c.k.dtype == DType::f8e4m3,
             "paged_attention on CUDA: the cache must be bf16 or f8e4m3, got ", c.k.describe());
  const bool nhd = c.layout == KvLayout::nhd;
  KILN_CHECK(
      c.k.stride[0] == c.v.stride[0] && c.k.stride[1] == c.v.stride[1] && c.k.stride[2] == c.v.stride[2],
      "paged_attention on CUDA: k and v must share strides");
  const bool fp8 = c.k.dtype == DType::f8e4m3;
  if (fp8) {
    KILN_CHECK(c.k_scale.stride[0] == c.v_scale.stride[0] && c.k_scale.stride[1] == c.v_scale.stride[1] &&
                   c.k_scale.stride[2] == c.v_scale.stride[2],
               "paged_attention on CUDA: k_scale and v_scale must share strides");
  }
  const int64_t B = a.cu_q.shape[0] - 1;
  kc::PagedAttnParams p{.q = a.q.data,
                        .q_stride_t = a.q.stride[0],
                        .q_stride_h = a.q.stride[1],
                        .out = a.out.data,
                        .o_stride_t = a.out.stride[0],
                        .o_stride_h = a.out.stride[1],
                        .k = c.k.data,
                        .v = c.v.data,
                        .s_page = c.k.stride[0],
                        .s_row = c.k.stride[nhd ? 1 : 2],
                        .s_head = c.k.stride[nhd ? 2 : 1],
                        .k_scale = fp8 ? c.k_scale.ptr<uint8_t>() : nullptr,
                        .v_scale = fp8 ? c.v_scale.ptr<uint8_t>() : nullptr,
                        .sc_page = fp8 ? c.k_scale.stride[0] : 0,
                        .sc_row = fp8 ? c.k_scale.stride[nhd ? 1 : 2] : 0,
                        .sc_head = fp8 ? c.k_scale.stride[nhd ? 2 : 1] : 0,
                        .kv_dtype = fp8 ? kc::KvDtype::f8e4m3 : kc::KvDtype::bf16,
                        .cu_q = a.cu_q.ptr<int32_t>(),
                        .kv_lens = a.kv_lens.ptr<int32_t>(),
                        .page_table = a.page_table.ptr<int32_t>(),
                        .pages_stride = int32_t(a.page_table.shape[1]),
                        .page_size = c.page_size,
                        .num_pages = int32_t(c.k.shape[0]),
                        .B = int32_t(B),
                        .T = int32_t(a.q.shape[0]),
                        .Hq = int32_t(a.q.shape[1]),
                        .Hkv = int32_t(c.k.shape[nhd ? 2 : 1]),
                        .D = int32_t(a.q.shape[2]),
                        .scale = a.scale,
                        .max_q_len = 0,
                        .min_q_len = a.min_q_len,
                        .prefill_pages = a.prefill_pages,
                        .decode_rows_per_seq = a.decode_rows_per_seq};
  // Token trees: the dispatcher checked both fields' dtypes, shapes and device (ops/attention.cpp); empty
  // ones (B == 0 or T == 0: nothing to attend) may have no data.
  if (a.tree_window.data != nullptr && a.tree_mask.data != nullptr) {
    p.tree_window = a.tree_window.ptr<int32_t>();
    p.tree_mask = reinterpret_cast<const uint64_t*>(a.tree_mask.ptr<int64_t>());
  }
  const size_t ws = kc::paged_attention_workspace_bytes(p);
  kc::paged_attention(p, ws ? kc::scratch(ws) : nullptr, kc::current_stream(), 0,
                      kc::pdl_for(kc::PdlSite::attention));
}

}  // namespace kiln::ops::cuda

namespace kiln::ops {
void* current_stream() {
  return ::kiln::cuda::current_stream();
}
}  // namespace kiln::ops
