#include "runtime/model_runner.h"

#include "kiln/error.h"
#include "runtime/kv_pool.h"

namespace kiln {

void pad_batch(BatchDesc& batch, int32_t num_seqs, int32_t rows_per_seq) {
  KILN_CHECK(rows_per_seq >= 1, "pad_batch: rows_per_seq must be positive");
  KILN_CHECK(num_seqs >= batch.num_seqs(), "pad_batch cannot shrink a batch");
  KILN_CHECK(!batch.mrope, "pad_batch: M-RoPE batches are not padded");
  if (batch.cu_q.empty()) batch.cu_q.push_back(0);
  if (batch.pages_stride == 0) {
    KILN_CHECK(batch.num_seqs() == 0, "pad_batch: page table stride 0 with sequences");
    batch.pages_stride = 1;
  }
  const bool tree = batch.has_tree();
  while (batch.num_seqs() < num_seqs) {
    for (int32_t j = 0; j < rows_per_seq; ++j) {
      batch.tokens.push_back(0);
      batch.positions.push_back(j);
      batch.slot_mapping.push_back(-1);
      if (tree) batch.tree_mask.push_back(0);
    }
    if (tree) batch.tree_window.push_back(0);  // a causal sequence
    batch.cu_q.push_back(batch.cu_q.back() + rows_per_seq);
    batch.kv_lens.push_back(rows_per_seq);
    if (!batch.seq_ids.empty()) batch.seq_ids.push_back(0);
    batch.page_table.insert(batch.page_table.end(), size_t(batch.pages_stride), KvPool::kNullPage);
  }
}

bool is_graphable_decode(const BatchDesc& batch) {
  const int32_t B = batch.num_seqs();
  // A token tree's masks are not in the graphs' attention: tree steps run eagerly.
  if (B == 0 || batch.num_tokens() != B || batch.mrope || batch.has_tree() ||
      batch.logit_rows.size() > size_t(B))
    return false;
  for (int32_t i = 0; i <= B; ++i)
    if (batch.cu_q[size_t(i)] != i) return false;
  for (size_t r = 0; r < batch.logit_rows.size(); ++r)
    if (batch.logit_rows[r] != int32_t(r)) return false;
  return true;
}

bool is_uniform_verify(const BatchDesc& batch, int32_t rows_per_seq) {
  const int32_t B = batch.num_seqs();
  if (B == 0 || rows_per_seq < 2 || batch.mrope || batch.num_tokens() != B * rows_per_seq ||
      batch.logit_rows.size() > size_t(batch.num_tokens()))
    return false;
  for (int32_t i = 0; i <= B; ++i)
    if (batch.cu_q[size_t(i)] != i * rows_per_seq) return false;
  for (size_t r = 0; r < batch.logit_rows.size(); ++r)
    if (batch.logit_rows[r] != int32_t(r)) return false;
  return true;
}

std::vector<int32_t> default_graph_buckets() {
  return {1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128};
}

}  // namespace kiln
