// Raw-pointer parameters of the attention-preparation kernels (the contract is in ops/attn_prep.h).
// Built once by the dispatcher (ops/attn_prep.cpp) after validation; kernels take it as
// `const __grid_constant__`. No CUDA types here so host C++ can build it.
#pragma once

#include <cstdint>

namespace kiln::cuda {

enum class ActKind : uint8_t { bf16, f16 };
enum class CacheKind : uint8_t { bf16, f16, fp8 };
enum class MRopeMode : uint8_t { none, sectioned, interleaved };

struct AttnPrepParams {
  int T = 0, Hq = 0, Hkv = 0, D = 0, rotary_dim = 0;
  ActKind act = ActKind::bf16;
  CacheKind cache = CacheKind::bf16;

  const void* qkv = nullptr;  // act [T, (Hq + 2*Hkv) * D]
  int64_t qkv_row = 0;        // row stride, elements
  void* q_dst = nullptr;      // act [T, Hq, D]: q_out, or qkv itself for Q in place
  int64_t q_row = 0, q_head = 0;
  const void* q_norm = nullptr;  // act [D]
  const void* k_norm = nullptr;  // act [D]
  float eps = 0.f;

  const void* pos = nullptr;  // i32 | i64 [T] or [3, T]
  bool pos_i64 = false;
  int64_t pos_axis = 0, pos_t = 0;  // strides (elements) between the (t, h, w) rows and between tokens
  MRopeMode mrope = MRopeMode::none;
  int section[3] = {0, 0, 0};
  const float* rope = nullptr;  // f32 [max_pos, rotary_dim]: cos | sin
  int64_t max_pos = 0;

  const int64_t* slots = nullptr;  // i64 [T]
  int64_t slot_stride = 0;
  int64_t num_slots = 0;
  int page_size = 0;
  // Cache element (page, row in page, head) -> page * c_page + row * c_row + head * c_head (+ d); the
  // layout (NHD / HND) lives only in these strides.
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int64_t c_page = 0, c_row = 0, c_head = 0;
  uint8_t* k_scale = nullptr;  // fp8 only: UE8M0 [.., D / 64]
  uint8_t* v_scale = nullptr;
  int64_t s_page = 0, s_row = 0, s_head = 0;
  bool pdl = false;  // host side: launch the fused kernel with programmatic dependent launch
};

// Launchers (attn_prep_unfused.cu, attn_prep_fused_*.cu). p validated; stream is a cudaStream_t.
void launch_attn_prep_unfused(const AttnPrepParams& p, void* stream);
enum class FusedKernel : uint8_t { decode, prefill, streaming };
void launch_attn_prep_fused(const AttnPrepParams& p, FusedKernel kernel, void* stream);
// The streaming kernel's extra guard: every group of a block handles at most 4 heads of a token.
bool attn_prep_streaming_supported(const AttnPrepParams& p);
// Fused guards beyond validation: head_dim 64/128/256, rotary_dim % 16 == 0, 16-byte aligned vectors.
bool attn_prep_fused_supported(const AttnPrepParams& p);

}  // namespace kiln::cuda
