#include "ops/attention.h"

#include <utility>

#include "ops/checks.h"
#include "ops/cpu/reference.h"
#include "ops/cuda/dispatch.h"

namespace kiln::ops {
namespace {

void check_cache(const KvCacheView& c, int64_t head_dim) {
  constexpr const char* op = "paged_attention";
  KILN_CHECK(c.k.dtype == DType::bf16 || c.k.dtype == DType::f16 || c.k.dtype == DType::f8e4m3, op,
             ": cache dtype must be bf16, f16 or f8e4m3, got ", c.k.describe());
  detail::check_matrix(op, "cache.k", c.k, 4, c.k.dtype);
  detail::check_matrix(op, "cache.v", c.v, 4, c.k.dtype);
  for (int i = 0; i < 4; ++i) {
    KILN_CHECK(c.k.shape[i] == c.v.shape[i], op, ": cache k ", c.k.describe(), " vs v ", c.v.describe());
  }
  const int64_t page_dim = c.layout == KvLayout::nhd ? 1 : 2;
  KILN_CHECK(c.page_size > 0 && c.k.shape[page_dim] == c.page_size, op, ": cache page_size ", c.page_size,
             " vs ", c.k.describe());
  KILN_CHECK_EQ(c.k.shape[3], head_dim, op, ": cache head_dim vs q head_dim");
  if (c.k.dtype == DType::f8e4m3) {
    KILN_CHECK(head_dim % 64 == 0, op, ": an fp8 cache needs head_dim % 64 == 0, got ", head_dim);
    for (const Tensor* s : {&c.k_scale, &c.v_scale}) {
      detail::check_matrix(op, "cache scale", *s, 4, DType::u8);
      for (int i = 0; i < 3; ++i) KILN_CHECK(s->shape[i] == c.k.shape[i], op, ": scale ", s->describe());
      KILN_CHECK_EQ(s->shape[3], head_dim / 64, op, ": scale groups per head");
      detail::check_same_device(op, c.k, *s);
    }
  }
}

// A tensor argument given at all (a default Tensor is "none"; an empty [0] view is given).
bool given(const Tensor& t) {
  return t.data != nullptr || t.ndim > 0;
}

// tree_window / tree_mask: none, or i32 [B] and i64 [T] on q's device. Their values are checked where they
// are read on the host (the CPU reference); CUDA kernels cannot throw, so there BatchDesc::validate's
// checks stand in (ops/attention.h).
void check_tree(const PagedAttentionArgs& a) {
  constexpr const char* op = "paged_attention";
  const bool window = given(a.tree_window), mask = given(a.tree_mask);
  KILN_CHECK(window == mask, op, ": tree_window and tree_mask must both be given or both be empty");
  if (!window) return;
  detail::check_matrix(op, "tree_window", a.tree_window, 1, DType::i32);
  detail::check_matrix(op, "tree_mask", a.tree_mask, 1, DType::i64);
  KILN_CHECK_EQ(a.tree_window.shape[0], a.cu_q.shape[0] - 1, op, ": tree_window vs the sequences of cu_q");
  KILN_CHECK_EQ(a.tree_mask.shape[0], a.q.shape[0], op, ": tree_mask vs the rows of q");
  for (const auto& [name, t] :
       {std::pair{"tree_window", &a.tree_window}, std::pair{"tree_mask", &a.tree_mask}})
    KILN_CHECK(t->device == a.q.device, op, ": ", name, " is on ", device_name(t->device), ", q on ",
               device_name(a.q.device));
}

}  // namespace

void paged_attention(const PagedAttentionArgs& a) {
  constexpr const char* op = "paged_attention";
  detail::check_matrix(op, "q", a.q, 3, DType::bf16);
  detail::check_matrix(op, "out", a.out, 3, DType::bf16);
  for (int i = 0; i < 3; ++i) {
    KILN_CHECK(a.out.shape[i] == a.q.shape[i], op, ": out ", a.out.describe(), " vs q ", a.q.describe());
  }
  check_cache(a.cache, a.q.shape[2]);
  const int64_t hkv = a.cache.k.shape[a.cache.layout == KvLayout::nhd ? 2 : 1];
  KILN_CHECK(hkv > 0 && a.q.shape[1] % hkv == 0, op, ": q heads ", a.q.shape[1],
             " not a multiple of kv heads ", hkv);
  detail::check_matrix(op, "cu_q", a.cu_q, 1, DType::i32);
  detail::check_matrix(op, "kv_lens", a.kv_lens, 1, DType::i32);
  detail::check_matrix(op, "page_table", a.page_table, 2, DType::i32);
  KILN_CHECK(a.cu_q.is_contiguous() && a.kv_lens.is_contiguous() && a.page_table.is_contiguous(), op,
             ": cu_q, kv_lens and page_table must be contiguous");
  KILN_CHECK(a.cu_q.shape[0] >= 1, op, ": cu_q needs B + 1 entries");
  KILN_CHECK_EQ(a.kv_lens.shape[0], a.cu_q.shape[0] - 1, op, ": kv_lens vs cu_q");
  KILN_CHECK_EQ(a.page_table.shape[0], a.cu_q.shape[0] - 1, op, ": page_table rows vs cu_q");
  KILN_CHECK(a.scale > 0.0f, op, ": scale must be positive");
  KILN_CHECK(a.out.data != a.q.data || a.out.numel() == 0, op, ": out must not alias q");
  for (const Tensor* t : {&a.out, &a.cache.k, &a.cache.v, &a.cu_q, &a.kv_lens, &a.page_table}) {
    detail::check_same_device(op, a.q, *t);
  }
  check_tree(a);
  if (a.q.device.is_cuda()) return KILN_CUDA_OP(paged_attention(a));
  cpu::paged_attention(a);
}

}  // namespace kiln::ops
