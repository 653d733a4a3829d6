// Logit processing on the GPU before kiln::cuda::sample: logit_bias, the min-token mask and the
// repetition / frequency / presence penalties, in place, computing exactly (bit for bit) what the CPU's
// runtime/logit_processor.h computes, in the same order:
//   1. sparse additions: logits[r, add_ids[j]] += add_vals[j] for j in [rows[r].adds_begin, adds_end)
//      (logit_bias; a masked id adds -inf). The ids of one row are distinct.
//   2. when rows[r].count_row >= 0, for every id whose entry c = counts[count_row, id] is non-zero
//      (c & kPromptBit: the id is in the prompt; c & ~kPromptBit: how often it was generated):
//        x = x > 0 ? x / repetition : x * repetition;  x = x - frequency * count;  if count: x = x - presence
//      each operation rounded once (no fused multiply-add); ids with c == 0 are not touched.
// counts: u32 [count rows, V], kept on the device across steps by the caller and updated with
// count_tokens() from the sampled tokens' device buffer, so a decode step needs no host round trip
// for the penalty history.
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace kiln::cuda {

inline constexpr uint32_t kPromptBit = 0x80000000u;

struct PenaltyRow {
  int32_t count_row = -1;  // row of `counts`; < 0: no penalty sweep
  int32_t adds_begin = 0;  // this row's entries of add_ids / add_vals: [adds_begin, adds_end)
  int32_t adds_end = 0;
  float presence = 0.0f;
  float frequency = 0.0f;
  float repetition = 1.0f;  // > 0
};

// logits: f32 [R, V] row stride ld; rows: device [R]; add_ids / add_vals: device, indexed by the rows'
// ranges (may be null when no row has additions); counts: device [*, V] (may be null when no row has
// count_row >= 0). Ids outside [0, V) are skipped. One block per row.
void apply_penalties(float* logits, int64_t ld, int64_t R, int64_t V, const PenaltyRow* rows,
                     const int32_t* add_ids, const float* add_vals, const uint32_t* counts,
                     cudaStream_t stream);

// For i < n with count_rows[i] >= 0 and 0 <= ids[i] < V: counts[count_rows[i], ids[i]] += 1, or with
// prompt = true |= kPromptBit. Atomic: repeated (row, id) pairs in one call all count.
void count_tokens(uint32_t* counts, int64_t V, const int32_t* count_rows, const int32_t* ids, int64_t n,
                  bool prompt, cudaStream_t stream);

}  // namespace kiln::cuda
