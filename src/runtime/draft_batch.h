// Draft pass batches (EAGLE-3): shared by the chains and the extend pass (engine_eagle3.cpp) and the tree
// drafting (engine_tree.cpp). Internal to the engine.
#pragma once

#include <algorithm>
#include <vector>

#include "kiln/batch.h"
#include "runtime/kv_pool.h"
#include "runtime/scheduler.h"

namespace kiln {

// Appends one sequence of `rows` rows (at least its tokens) at positions begin .. begin + rows - 1 to a draft
// batch: its tokens at slots of the target's pages, then fill rows (token 0, slot -1: no K/V written); its
// length begin + rows; and, when `logit`, a logit row at its last token's row (its first row if it has none).
inline void add_draft_seq(BatchDesc& b, const Sequence& s, int32_t begin, const std::vector<int32_t>& tokens,
                          bool logit, int32_t rows) {
  const int32_t ps = b.page_size, n = int32_t(tokens.size());
  for (int32_t j = 0; j < rows; ++j) {
    const int32_t pos = begin + j;
    b.tokens.push_back(j < n ? tokens[size_t(j)] : 0);
    b.positions.push_back(pos);
    b.slot_mapping.push_back(j < n ? int64_t(s.pages[size_t(pos / ps)]) * ps + pos % ps : -1);
  }
  if (logit) b.logit_rows.push_back(b.cu_q.back() + std::max(n, 1) - 1);
  b.cu_q.push_back(b.cu_q.back() + rows);
  b.kv_lens.push_back(begin + rows);
  b.seq_ids.push_back(s.id);
}

// The page table of a draft batch whose sequences' rows end at kv_lens: each row its pages, then null pages
// (also past the pages a sequence holds: a uniform pass's fill rows, which write nothing, may reach there).
inline void fill_page_table(BatchDesc& b, const std::vector<const Sequence*>& seqs) {
  const int32_t ps = b.page_size;
  b.pages_stride = 1;
  for (int32_t len : b.kv_lens) b.pages_stride = std::max(b.pages_stride, (len + ps - 1) / ps);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int32_t used = std::min((b.kv_lens[i] + ps - 1) / ps, int32_t(seqs[i]->pages.size()));
    for (int32_t p = 0; p < b.pages_stride; ++p)
      b.page_table.push_back(p < used ? seqs[i]->pages[size_t(p)] : KvPool::kNullPage);
  }
}

inline BatchDesc empty_draft_batch(int32_t page_size) {
  BatchDesc b;
  b.page_size = page_size;
  b.cu_q.assign(1, 0);
  return b;
}

}  // namespace kiln
