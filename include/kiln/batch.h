// BatchDesc: the one per-step descriptor the runtime hands the model. Several sequences per step,
// each with its new tokens; prefill rows (q_len > 1, or a first chunk) and decode rows (q_len == 1)
// mixed freely. Host-side vectors; a backend uploads them (into preallocated buffers for graphs).
//
// Invariants (checked by validate()):
//   tokens.size() == positions.size() == slot_mapping.size() == T == cu_q.back()
//   cu_q is non-decreasing, cu_q[0] == 0, size B + 1
//   kv_lens[b] >= q_len(b): the context after this step's tokens are written (cached prefix + new)
//   the new tokens of sequence b sit at context positions [kv_lens[b] - q_len(b), kv_lens[b])
//   page_table[b * pages_stride + i] is the page holding context tokens [i*page_size, (i+1)*page_size)
//   slot_mapping[t] = page * page_size + offset, or -1 for a padded row (the cache write skips it)
//   logit_rows lists the token rows (ascending) whose logits the step must produce
//   token trees (tree_window / tree_mask, below): either both empty or sized [B] and [T], see there
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

struct BatchDesc {
  std::vector<int32_t> tokens;     // [T]
  std::vector<int32_t> positions;  // [T]; for M-RoPE [3, T] (t, h, w rows), see mrope
  bool mrope = false;
  std::vector<int64_t> slot_mapping;  // [T]
  std::vector<int32_t> cu_q;          // [B + 1] prefix sums of new tokens per sequence
  std::vector<int32_t> kv_lens;       // [B] context length after this step
  std::vector<int32_t> page_table;    // [B, pages_stride]
  int32_t pages_stride = 0;
  int32_t page_size = 0;
  std::vector<int32_t> logit_rows;  // token rows that need logits (usually each sequence's last)
  // [B] or empty: the request each sequence belongs to (0 for padding). The runtime's scheduler fills it so
  // a runner can find per-request state (Qwen3-VL images and M-RoPE positions); the model ignores it.
  std::vector<uint64_t> seq_ids;
  // Token trees (speculative decoding: a verify step over a tree of drafts, an EAGLE draft pass over a tree's
  // frontier). Both empty: every row is causal. Else tree_window [B] and tree_mask [T]: sequence b's last
  // W = tree_window[b] context positions [kv_lens[b] - W, kv_lens[b]) form its tree window (0 <= W <= 64; W =
  // 0: b is causal, its rows' masks must be 0; else W >= q_len(b), so its new tokens are the window's last
  // q_len(b) positions). Row t of b, at context position p (its new-token order, as above), sees every
  // position before the window, and a window position kv_lens[b] - W + i only where bit i of tree_mask[t] is
  // set. Its own bit must be set and no bit above it (a row sees no later position): a parent precedes its
  // children. A chain's masks (row i: bits 0 .. its own) give the causal rows bit for bit.
  std::vector<int32_t> tree_window;
  std::vector<uint64_t> tree_mask;

  int32_t num_tokens() const { return int32_t(tokens.size()); }
  int32_t num_seqs() const { return cu_q.empty() ? 0 : int32_t(cu_q.size()) - 1; }
  int32_t q_len(int b) const { return cu_q[b + 1] - cu_q[b]; }
  bool has_tree() const { return !tree_window.empty(); }
  void validate(int64_t vocab_size, int64_t num_pages) const;  // throws kiln::Error
  // Text tokens under M-RoPE (Qwen3-VL): the [T] positions become three equal (t, h, w) rows, which
  // rotate exactly as plain RoPE does. No-op when mrope is already set.
  void set_text_mrope();
};

}  // namespace kiln
