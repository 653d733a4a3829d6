#include "runtime/model_runner.h"

#include "kiln/error.h"
#include "runtime/kv_pool.h"

namespace kiln {

void pad_batch(BatchDesc& batch, int32_t num_seqs) {
  KILN_CHECK(num_seqs >= batch.num_seqs(), "pad_batch cannot shrink a batch");
  KILN_CHECK(!batch.mrope, "pad_batch: M-RoPE batches are not padded");
  if (batch.cu_q.empty()) batch.cu_q.push_back(0);
  if (batch.pages_stride == 0) {
    KILN_CHECK(batch.num_seqs() == 0, "pad_batch: page table stride 0 with sequences");
    batch.pages_stride = 1;
  }
  while (batch.num_seqs() < num_seqs) {
    batch.tokens.push_back(0);
    batch.positions.push_back(0);
    batch.slot_mapping.push_back(-1);
    batch.cu_q.push_back(batch.cu_q.back() + 1);
    batch.kv_lens.push_back(1);
    batch.page_table.insert(batch.page_table.end(), size_t(batch.pages_stride), KvPool::kNullPage);
  }
}

}  // namespace kiln
