// CudaDecodeGraph: decode steps of a Qwen3Model, `num_seqs` sequences of one new token each, replayed
// from one CUDA graph.
//
// Each step stages the batch metadata (tokens, positions, slots, kv_lens, page table) into the model's
// workspace with ordinary copies, then replays a graph of every launch of the step (all layers and the
// LM head). The graph holds only device pointers to those staged buffers, so new inputs need no
// recapture: it is correct when inputs change between replays (tests/cuda/test_cuda_graph.cpp checks
// replay == eager bit for bit). It is recaptured when a workspace buffer was reallocated (a larger step
// ran in between; Qwen3Model::reserve_workspace avoids that). The page table is re-laid to a fixed width,
// so one graph serves every context up to pages_stride * page_size tokens and the decode attention's
// split count stays fixed. The LM head runs over all num_seqs rows (a fixed shape); rows of padding
// sequences (runtime/model_runner.h pad_batch) produce logits nobody reads. Programmatic dependent launch
// is fixed when the graph is constructed (the pdl argument), whatever ops/cuda/context.h's set_pdl says
// when a later step recaptures.
//
// Verify steps (speculative decoding): with rows_per_seq = q >= 2 every sequence computes q positions (its
// last token and its drafts, short ones filled to q with slot -1 rows) and the LM head runs over all
// num_seqs * q rows. For q <= 4 (ops/cuda/attention.h verify_decode_max_rows) every row goes through the
// decode attention kernel as its own row group (ops/attention.h decode_rows_per_seq: bitwise the plain decode
// step's rows), else through the prefill kernel (min_q_len = q skips the decode launch); either launch shape
// is fixed per graph. The fp8 cache's prefill staging is sized from each step's context lengths, so a verify
// graph runs without it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "kiln/batch.h"
#include "kiln/tensor.h"
#include "model/kv_cache.h"
#include "model/qwen3.h"

namespace kiln {

// `in` into `out` (a graph's staged batch, reused) with its page table re-laid to `table_rows` rows (>= its
// sequences) of `width` pages (>= its own): the other entries 0, a valid page that kv_lens keeps unread.
// tree: the batch is a token tree (its tree_window / tree_mask copied) for a tree graph; a tree batch for any
// other graph, or a tree graph's batch without masks, is refused.
void copy_with_table_width(const BatchDesc& in, int32_t table_rows, int32_t width, BatchDesc& out,
                           bool tree = false);

// Captures the launches `launch` makes on `stream` (a cudaStream_t of its own, not the legacy stream) into a
// CUDA graph and instantiates it into *graph and *exec (cudaGraph_t, cudaGraphExec_t), destroying the ones
// they held. A throw from `launch` ends the capture (the stream stays usable) and propagates.
void capture_cuda_graph(void* stream, const std::function<void()>& launch, void** graph, void** exec);

class CudaDecodeGraph {
 public:
  // model and cache on one CUDA device; pages_stride: the page-table width of every step; num_seqs: the
  // batch size of every step. logits: where the LM head writes, f32 [>= num_seqs, vocab] on the device
  // (several graphs of one runner may share it); empty: the graph allocates its own. pdl: whether the
  // graph's launches use programmatic dependent launch; unset: the process's setting now (set_pdl).
  // rows_per_seq: the new tokens of every sequence (1: decode; q >= 2: verify, logits [>= num_seqs * q]).
  // tree (verify graphs): every step is a token tree (BatchDesc::tree_window / tree_mask, staged at the
  // workspace's fixed addresses and read by the captured attention); a graph without it takes no tree.
  CudaDecodeGraph(Qwen3Model& model, KvCache& cache, int32_t pages_stride, int32_t num_seqs = 1,
                  Tensor logits = {}, std::optional<bool> pdl = std::nullopt, int32_t rows_per_seq = 1,
                  bool tree = false);
  ~CudaDecodeGraph();
  CudaDecodeGraph(const CudaDecodeGraph&) = delete;
  CudaDecodeGraph& operator=(const CudaDecodeGraph&) = delete;

  // One decode step: b has num_seqs sequences of one new token each (rows_per_seq each for a verify graph),
  // logit_rows == {0, 1, ..., R-1} (R <= num_seqs * rows_per_seq: rows past R are padding), no M-RoPE,
  // b.pages_stride <= the graph's (each row is padded). Returns f32 [R, vocab] logits on the device, valid
  // until the next step of any graph sharing the buffer. The inputs' copies and the replay are queued on
  // stream() after the host waited for the graph's earlier steps; token_ids: device memory holding the R
  // rows' input tokens, copied over b.tokens on the stream (the overlap schedule's chained step: the previous
  // step's draws), and no wait (decode graphs only).
  Tensor step(const BatchDesc& b, const int32_t* token_ids = nullptr);
  int captures() const { return captures_; }
  int32_t rows_per_seq() const { return rows_per_seq_; }
  void* stream() const { return stream_; }

 private:
  void capture();

  Qwen3Model& model_;
  KvCache& cache_;
  int32_t pages_stride_;
  int32_t num_seqs_;
  int32_t rows_per_seq_;
  bool tree_;
  Buffer logits_buf_;
  Tensor logits_;           // f32 [num_seqs, vocab]
  BatchDesc staged_;        // reused across steps: no per-step allocation of the re-laid page table
  void* stream_ = nullptr;  // cudaStream_t (blocking: ordered with the legacy stream's synchronous copies)
  void* graph_ = nullptr;   // cudaGraph_t
  void* exec_ = nullptr;    // cudaGraphExec_t
  uint64_t generation_ = 0;
  int captures_ = 0;
  bool pdl_ = false;  // launches inside the graph use PDL
};

}  // namespace kiln
