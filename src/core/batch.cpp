#include "kiln/batch.h"

#include <algorithm>

#include "kiln/error.h"

namespace kiln {

void BatchDesc::validate(int64_t vocab_size, int64_t num_pages) const {
  const size_t T = tokens.size();
  KILN_CHECK_EQ(positions.size(), mrope ? 3 * T : T, "positions size");
  KILN_CHECK_EQ(slot_mapping.size(), T, "slot_mapping size");
  KILN_CHECK(seq_ids.empty() || seq_ids.size() + 1 == cu_q.size(),
             "seq_ids must be empty or one per sequence");
  KILN_CHECK(!cu_q.empty() && cu_q.front() == 0, "cu_q must start at 0");
  KILN_CHECK_EQ(size_t(cu_q.back()), T, "cu_q must end at the token count");
  const int B = num_seqs();
  KILN_CHECK_EQ(kv_lens.size(), size_t(B), "kv_lens size");
  KILN_CHECK(page_size > 0, "page_size must be positive");
  KILN_CHECK_EQ(page_table.size(), size_t(B) * size_t(pages_stride), "page_table size");
  for (int b = 0; b < B; ++b) {
    KILN_CHECK(q_len(b) >= 0, "cu_q must be non-decreasing");
    KILN_CHECK(kv_lens[b] >= q_len(b), "sequence ", b, ": kv_len ", kv_lens[b], " < new tokens ", q_len(b));
    KILN_CHECK(int64_t(kv_lens[b]) <= int64_t(pages_stride) * page_size, "sequence ", b,
               ": page table too short");
    for (int i = 0; i < (kv_lens[b] + page_size - 1) / page_size; ++i) {
      const int32_t p = page_table[size_t(b) * pages_stride + i];
      KILN_CHECK(p >= 0 && p < num_pages, "sequence ", b, ": page ", p, " out of range");
    }
  }
  for (size_t t = 0; t < T; ++t) {
    KILN_CHECK(tokens[t] >= 0 && tokens[t] < vocab_size, "token id ", tokens[t], " out of range [0, ",
               vocab_size, ")");
    KILN_CHECK(slot_mapping[t] < num_pages * page_size, "slot ", slot_mapping[t], " out of range");
  }
  KILN_CHECK(tree_window.empty() == tree_mask.empty(),
             "tree_window and tree_mask must both be set or both empty");
  if (has_tree()) {
    KILN_CHECK_EQ(tree_window.size(), size_t(B), "tree_window size");
    KILN_CHECK_EQ(tree_mask.size(), T, "tree_mask size");
    for (int b = 0; b < B; ++b) {
      const int32_t W = tree_window[size_t(b)], q = q_len(b);
      KILN_CHECK(W >= 0 && W <= 64, "sequence ", b, ": tree window ", W, " outside [0, 64]");
      KILN_CHECK(W == 0 || (W >= q && W <= kv_lens[size_t(b)]), "sequence ", b, ": tree window ", W,
                 " must hold its ", q, " new tokens and fit its context of ", kv_lens[size_t(b)]);
      for (int32_t j = 0; j < q; ++j) {
        const uint64_t m = tree_mask[size_t(cu_q[size_t(b)] + j)];
        if (W == 0) {
          KILN_CHECK(m == 0, "sequence ", b, ": row ", j, " has a tree mask outside a tree window");
          continue;
        }
        const int32_t own = W - q + j;  // the row's bit: its position's index in the window
        KILN_CHECK((m >> own) & 1, "sequence ", b, ": row ", j, " does not see its own position");
        KILN_CHECK(own == 63 || (m >> (own + 1)) == 0, "sequence ", b, ": row ", j, " sees a later position");
      }
    }
  }
  for (size_t i = 0; i < logit_rows.size(); ++i) {
    KILN_CHECK(logit_rows[i] >= 0 && size_t(logit_rows[i]) < T, "logit row out of range");
    KILN_CHECK(i == 0 || logit_rows[i] > logit_rows[i - 1], "logit rows must ascend");
  }
}

void BatchDesc::set_text_mrope() {
  if (mrope) return;
  const size_t T = positions.size();
  positions.resize(3 * T);
  std::copy_n(positions.begin(), T, positions.begin() + std::ptrdiff_t(T));
  std::copy_n(positions.begin(), T, positions.begin() + std::ptrdiff_t(2 * T));
  mrope = true;
}

}  // namespace kiln
