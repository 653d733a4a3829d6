#include "runtime/device_penalties.h"

#include <algorithm>
#include <cstring>

#include "kiln/error.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kiln/cuda_check.h"
#include "ops/cuda/logit_mask.h"
#include "ops/cuda/sampling_penalties.h"
#endif

namespace kiln {

#ifdef KILN_HAVE_CUDA
namespace {

// Appends a POD array to the host staging bytes at a 16-byte boundary; returns its offset.
template <typename T>
size_t put(std::vector<char>& bytes, const std::vector<T>& v) {
  const size_t off = (bytes.size() + 15) / 16 * 16;
  bytes.resize(off + v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(bytes.data() + off, v.data(), v.size() * sizeof(T));
  return off;
}

}  // namespace

int32_t DevicePenalties::take_row(CUstream_st* stream) {
  if (free_rows_.empty()) {
    const int32_t cap = capacity_ == 0 ? 8 : 2 * capacity_;
    Buffer grown(size_t(cap) * size_t(vocab_) * 4, device_);
    if (capacity_ > 0)
      copy_bytes(grown.data(), device_, counts_.data(), device_, size_t(capacity_) * size_t(vocab_) * 4);
    counts_ = std::move(grown);
    for (int32_t r = cap - 1; r >= capacity_; --r) free_rows_.push_back(r);
    capacity_ = cap;
  }
  const int32_t row = free_rows_.back();
  free_rows_.pop_back();
  KILN_CUDA_CHECK(cudaMemsetAsync(static_cast<uint32_t*>(counts_.data()) + int64_t(row) * vocab_, 0,
                                  size_t(vocab_) * 4, stream));
  return row;
}

bool DevicePenalties::apply(float* logits, int64_t ld, const std::vector<ModelRunner::RowSampling>& rows,
                            CUstream_st* stream) {
  const size_t R = rows.size();
  step_requests_.assign(R, 0);
  step_counts_ = false;
  std::vector<cuda::PenaltyRow> pr(R);
  std::vector<int32_t> count_rows(R, -1), add_ids;
  std::vector<float> add_vals;
  std::vector<int32_t> prompt_rows, prompt_ids, out_rows, out_ids;  // pending count updates
  std::vector<int32_t> mask_rows;  // logit rows under a grammar mask, and their words
  size_t mask_words = 0;
  for (const ModelRunner::RowSampling& rs : rows)
    if (rs.proc) mask_words = std::max(mask_words, rs.proc->token_mask().size());
  std::vector<uint32_t> masks;
  bool any = false;
  for (size_t r = 0; r < R; ++r) {
    const LogitProcessor* p = rows[r].proc;
    if (!p || !p->active()) continue;
    any = true;
    pr[r].adds_begin = int32_t(add_ids.size());
    for (const auto& [id, v] : p->sparse_adds()) add_ids.push_back(id), add_vals.push_back(v);
    pr[r].adds_end = int32_t(add_ids.size());
    if (const std::vector<uint32_t>& m = p->token_mask(); !m.empty()) {
      mask_rows.push_back(int32_t(r));
      masks.insert(masks.end(), m.begin(), m.end());
      masks.resize(mask_rows.size() * mask_words, 0u);
    }
    if (!p->has_penalties()) continue;
    pr[r].presence = p->presence();
    pr[r].frequency = p->frequency();
    pr[r].repetition = p->repetition();
    const std::vector<int32_t>& gen = p->generated();
    auto it = slots_.find(rows[r].request);
    if (it != slots_.end() && it->second.counted > gen.size()) {  // a draw the engine did not keep
      free_rows_.push_back(it->second.row);
      slots_.erase(it);
      it = slots_.end();
    }
    if (it == slots_.end()) {
      it = slots_.emplace(rows[r].request, Slot{take_row(stream), 0}).first;
      for (int32_t t : p->prompt()) prompt_rows.push_back(it->second.row), prompt_ids.push_back(t);
    }
    Slot& s = it->second;
    for (size_t i = s.counted; i < gen.size(); ++i) out_rows.push_back(s.row), out_ids.push_back(gen[i]);
    s.counted = gen.size();
    pr[r].count_row = count_rows[r] = s.row;
    step_requests_[r] = rows[r].request;
    step_counts_ = true;
  }
  if (!any) return false;
  std::vector<char> bytes;
  const size_t o_pr = put(bytes, pr), o_cr = put(bytes, count_rows), o_ai = put(bytes, add_ids),
               o_av = put(bytes, add_vals), o_pr_rows = put(bytes, prompt_rows),
               o_pr_ids = put(bytes, prompt_ids), o_out_rows = put(bytes, out_rows),
               o_out_ids = put(bytes, out_ids), o_mask_rows = put(bytes, mask_rows),
               o_masks = put(bytes, masks);
  if (staging_.bytes() < bytes.size()) staging_ = Buffer(bytes.size() * 2, device_);
  // Asynchronous, from pinned memory, on the stream that reads it: the host does not wait for the forward
  // pass queued before it (a pageable copy would).
  uploads_.begin(StagedUploads::footprint(bytes.size()), stream);
  uploads_.copy(staging_.data(), bytes.data(), bytes.size());
  uploads_.end();
  char* base = static_cast<char*>(staging_.data());
  auto at = [&](size_t off) { return base + off; };
  auto* counts = static_cast<uint32_t*>(counts_.data());
  cuda::count_tokens(counts, vocab_, reinterpret_cast<int32_t*>(at(o_pr_rows)),
                     reinterpret_cast<int32_t*>(at(o_pr_ids)), int64_t(prompt_ids.size()), true, stream);
  cuda::count_tokens(counts, vocab_, reinterpret_cast<int32_t*>(at(o_out_rows)),
                     reinterpret_cast<int32_t*>(at(o_out_ids)), int64_t(out_ids.size()), false, stream);
  cuda::apply_penalties(logits, ld, int64_t(R), vocab_, reinterpret_cast<cuda::PenaltyRow*>(at(o_pr)),
                        add_ids.empty() ? nullptr : reinterpret_cast<int32_t*>(at(o_ai)),
                        add_vals.empty() ? nullptr : reinterpret_cast<float*>(at(o_av)), counts, stream);
  // The grammar mask last (logit_processor.h step 6): -inf stays -inf through the steps before it.
  cuda::apply_token_bitmask(logits, ld, vocab_, reinterpret_cast<int32_t*>(at(o_mask_rows)),
                            reinterpret_cast<uint32_t*>(at(o_masks)), int64_t(mask_words),
                            int64_t(mask_rows.size()), stream);
  step_rows_dev_ = reinterpret_cast<int32_t*>(at(o_cr));
  return true;
}

void DevicePenalties::count_sampled(const int32_t* tokens, int64_t R, CUstream_st* stream) {
  if (!step_counts_) return;
  KILN_CHECK_EQ(size_t(R), step_requests_.size(), "count_sampled: rows differ from the last apply()");
  cuda::count_tokens(static_cast<uint32_t*>(counts_.data()), vocab_, step_rows_dev_, tokens, R, false,
                     stream);
  for (uint64_t req : step_requests_)
    if (req != 0) ++slots_.at(req).counted;
  step_counts_ = false;
}

void DevicePenalties::release(uint64_t request) {
  auto it = slots_.find(request);
  if (it == slots_.end()) return;
  free_rows_.push_back(it->second.row);
  slots_.erase(it);
}

#else  // no CUDA: forward_sampled declines before it gets here

bool DevicePenalties::apply(float*, int64_t, const std::vector<ModelRunner::RowSampling>&, CUstream_st*) {
  return false;
}
void DevicePenalties::count_sampled(const int32_t*, int64_t, CUstream_st*) {}
void DevicePenalties::release(uint64_t) {}

#endif

}  // namespace kiln
