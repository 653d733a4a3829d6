// ModelRunner: what the engine needs from a model backend, behind one interface so the engine can run
// the real Qwen3 model (qwen3_runner.cpp) or a deterministic fake (fake_runner.h) in tests.
// Called only from the engine thread.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/batch.h"
#include "kiln/config.h"
#include "kiln/error.h"
#include "kiln/tensor.h"
#include "model/eagle3_model.h"
#include "model/qwen3_vl_prompt.h"
#include "runtime/engine.h"
#include "runtime/logit_processor.h"
#include "runtime/prompt_logprobs.h"

namespace kiln {

// Thrown by a runner that can run no further step (a tensor-parallel rank failed, runtime/tp_runner.h): the
// engine ends every request with its message and stops; later submits are refused with it.
class RunnerFatalError : public Error {
 public:
  explicit RunnerFatalError(const std::string& what) : Error(what) {}
};

// Thrown by forward / forward_sampled when the step stopped early because every request it was working for
// had been abandoned (set_abandoned_check): nothing was computed and no KV written; the engine ends the
// abandoned requests and plans the others again, as if the step had not been planned.
class StepCancelled : public Error {
 public:
  explicit StepCancelled(const std::string& what) : Error(what) {}
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const ModelConfig& config() const = 0;
  virtual Device device() const = 0;
  // KV bytes one token takes over all layers (K and V together): sizes the pool from memory.
  virtual int64_t kv_bytes_per_token() const = 0;
  // Bytes this backend may spend on KV when kiln may use `mem_fraction` of the device's memory.
  virtual int64_t kv_memory_budget(double mem_fraction) const = 0;
  // Allocates the paged KV storage. Called once, before the first forward().
  virtual void allocate_kv(int32_t num_pages, int32_t page_size) = 0;
  // CUDA graphs for decode-only steps. The engine calls this once, after allocate_kv, unless graphs are
  // disabled: the runner may capture graphs for these batch sizes now and size its step workspace so
  // that later steps within the bounds reallocate nothing. Runners without graphs ignore it.
  struct GraphPlan {
    std::vector<int32_t> buckets;   // batch sizes, ascending, each >= 1
    int32_t max_pages_per_seq = 0;  // the widest page table a sequence can need (context limit / page)
    int64_t max_step_tokens = 0;    // tokens of the largest step the scheduler may form
    int32_t max_seqs = 0;           // sequences of the largest step
    bool pdl = true;                // programmatic dependent launch between the graphs' kernels ...
    // ... of buckets of at least this many sequences. On the H200 (2026-12-02, `af20cce`;
    // bench/results/h200_pdl_decode_step_2026-12-02.txt) PDL speeds the one-sequence Qwen3-4B graph by 4.5 %
    // and the 0.6B one by 11 % since the GEMVs let their dependents launch right after their own wait (it
    // slowed them by 9 % while the GEMVs prefetched W into L2 before the wait and let dependents launch only
    // at their end).
    int32_t pdl_min_batch = 1;
    // Speculative decoding: k + 1, the positions each sequence of a verify step computes (0: no verify
    // steps). The runner sizes its workspace for verify graphs of that width (verify_graph_bucket).
    int32_t verify_rows_per_seq = 0;
    // EAGLE-3 token trees (SpecOptions::tree): every verify step is a token tree, so the verify graphs are
    // tree graphs (verify_graph_bucket's tree = true; none for chains).
    bool verify_trees = false;
  };
  virtual void prepare_graphs(const GraphPlan& /*plan*/) {}
  // CUDA-graph seam: the number of sequences to pad `batch` to (rows with slot -1, no logits, pointing
  // at KvPool::kNullPage), or 0 to run it eagerly as is. The engine pads with pad_batch() before forward.
  virtual int32_t graph_bucket(const BatchDesc& /*batch*/) const { return 0; }
  // Verify steps of speculative decoding (runtime/engine_spec.cpp) in CUDA graphs: a step of num_seqs decode
  // sequences that each compute rows_per_seq positions (its last token and its drafts; a row with fewer
  // drafts filled to the width with rows whose slot is -1) with logits at every row (is_uniform_verify).
  // Returns the number of sequences to pad such a step to (pad_batch with rows_per_seq) for a graph per
  // (bucket, rows_per_seq), or 0: the engine then builds the step with each row's own length and runs it
  // eagerly. tree: a token-tree step's (a tree graph, GraphPlan::verify_trees).
  virtual int32_t verify_graph_bucket(int32_t /*num_seqs*/, int32_t /*rows_per_seq*/,
                                      int32_t /*pages_stride*/, bool /*tree*/) const {
    return 0;
  }
  // The positions the step's rows rotate by, set once the batch is formed and padded. Default: a model
  // with M-RoPE (Qwen3-VL) gets three equal text rows (BatchDesc::set_text_mrope).
  virtual void place_positions(BatchDesc& batch) const {
    if (!config().mrope_section.empty()) batch.set_text_mrope();
  }
  // One step over `batch` (already validated). For each batch.logit_rows entry, in order: logits
  // [vocab] f32 into *logits (when non-null) and the final-norm hidden state [hidden] f32 into *hidden
  // (when non-null). Both are resized by the callee. Throws kiln::Error on failure.
  virtual void forward(const BatchDesc& batch, std::vector<float>* logits, std::vector<float>* hidden) = 0;
  // forward(), and per query the log-probabilities of its row (runtime/prompt_logprobs.h's contract) into
  // *out, one RowLogprobs per query. The default runs forward() over the logit rows and the query rows
  // together and reduces on the host (a host copy of [rows, vocab] f32: the engine bounds the rows);
  // Qwen3Runner reduces on the device and copies back only the answers.
  virtual void forward_logprobs(const BatchDesc& batch, std::vector<float>* logits,
                                std::vector<float>* hidden, const std::vector<LogprobQuery>& queries,
                                std::vector<RowLogprobs>* out);

  // Device-side sampling seam. Per logit row: the parameters of its draw (step = the request's output
  // token index, so a seeded request draws the same tokens whatever it is batched with).
  struct RowSampling {
    float temperature = 0.0f;  // <= 0: greedy (lowest id among the maximal logits)
    int32_t top_k = 0;         // <= 0: off
    float top_p = 1.0f;
    uint64_t seed = 0;
    uint64_t step = 0;
    // The request's logit processing (bias, min-token mask, penalties), applied to the row before the
    // draw and the logprobs exactly as LogitProcessor::apply does; null or inactive: none. Its
    // generated() history is complete up to this step; the runner may keep device state for it under
    // `request` until release_request().
    const LogitProcessor* proc = nullptr;
    uint64_t request = 0;
  };
  struct SampledRow {
    int32_t token = -1;
    float logprob = 0.0f;           // raw log-softmax of the chosen token
    std::vector<TokenLogprob> top;  // top_n alternatives, when asked
  };
  // Runs the step and samples every logit row on the device, leaving only the tokens to copy back.
  // Returns false, having run nothing, when this runner cannot (the engine then calls forward() and
  // samples on the host). `before_sample` (may be empty) runs before the call returns, its caller waiting,
  // once the step's forward pass is enqueued and before any row's logit processor is read: on CUDA the GPU
  // runs the forward while it does, so the engine waits for the step's grammar masks there and hands them to
  // the processors (runtime/grammar_masks.h). It is not called when the runner declines or the forward
  // throws.
  bool forward_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                       std::vector<SampledRow>* out) {
    return forward_sampled(batch, rows, top_n, out, {});
  }
  virtual bool forward_sampled(const BatchDesc& /*batch*/, const std::vector<RowSampling>& /*rows*/,
                               int /*top_n*/, std::vector<SampledRow>* /*out*/,
                               const std::function<void()>& /*before_sample*/) {
    return false;
  }
  // The overlap schedule's seam (EngineOptions::overlap_schedule): launch a graphable decode step with device
  // sampling and return before it has run; collect_sampled() waits for the oldest launched step and returns
  // its rows, as forward_sampled would have. chained: the step's input tokens are the sampled tokens of the
  // step launched just before it, row for row, taken where they were drawn (batch.tokens is ignored), so the
  // engine can launch step N + 1 before it has seen step N's tokens. At most two steps are launched and not
  // collected. Returns false, having run nothing, when this runner cannot run this step so (the engine then
  // collects what is in flight and runs the step with forward_sampled).
  virtual bool launch_sampled(const BatchDesc& /*batch*/, const std::vector<RowSampling>& /*rows*/,
                              int /*top_n*/, bool /*chained*/) {
    return false;
  }
  // The same for steps with constrained rows, whose grammar masks need the tokens of the step before
  // (runtime/grammar_masks.h): launch_forward queues only the forward pass of such a step (chained as above;
  // top_n: the alternatives its draws will carry) and returns false, having run nothing, where launch_sampled
  // would; sample_launched(rows) then queues the sampling of the step launched last, with each row's logit
  // processing (its grammar mask) applied, while the forward may still run. A step launched so is sampled
  // before any other step is launched or collected.
  virtual bool launch_forward(const BatchDesc& /*batch*/, int /*top_n*/, bool /*chained*/) { return false; }
  virtual void sample_launched(const std::vector<RowSampling>& /*rows*/) {
    KILN_FAIL("this model runner launches no forward passes ahead (launch_forward)");
  }
  virtual void collect_sampled(std::vector<SampledRow>* /*out*/) {
    KILN_FAIL("this model runner launches no steps ahead (launch_sampled)");
  }
  // After a failed launch or collect: waits for and drops every launched step (their rows end in error).
  virtual void abandon_launched() {}
  // The request ended: whatever device state forward_sampled kept for it may go (and its images).
  virtual void release_request(uint64_t /*request*/) {}
  // The engine's "is this request abandoned" (aborted, or an abortive shutdown), callable from the engine
  // thread during a step. A runner with long indivisible work (a Qwen3-VL vision pass) polls it and throws
  // StepCancelled when everything that work serves is abandoned. Set once, before the first step.
  virtual void set_abandoned_check(std::function<bool(uint64_t request)> /*abandoned*/) {}
  // Qwen3-VL: the images of `request`, already checked against its prompt (layout_vl_prompt); the runner
  // encodes them when a step computes their pad tokens and keeps them until release_request. The engine
  // calls it only for a model with a vision tower (submit rejects images otherwise).
  // EAGLE-3 speculative decoding (runtime/engine_eagle3.cpp): a runner with a draft model (Eagle3Model)
  // beside the target. Its draft KV is one layer in the target's pages (allocate_kv sizes both;
  // kv_bytes_per_token counts both). A pass returns, per logit row of `batch`, the draft's top-1 token (a
  // target id) and its midlayer output [H] f32 (the next chain row's hidden state).
  virtual bool has_draft() const { return false; }
  using DraftOut = Eagle3Model::Out;
  // Row t of `batch` starts from the target features of row step_rows[t] of the last forward /
  // forward_sampled / forward_logprobs step (the target captured them).
  virtual void draft_from_step(const BatchDesc& /*batch*/, const std::vector<int32_t>& /*step_rows*/,
                               DraftOut* /*out*/) {
    KILN_FAIL("this model runner has no EAGLE-3 draft");
  }
  // Row t starts from hidden[t] ([T, H] f32: an earlier pass's DraftOut::hidden rows).
  virtual void draft_from_hidden(const BatchDesc& /*batch*/, const std::vector<float>& /*hidden*/,
                                 DraftOut* /*out*/) {
    KILN_FAIL("this model runner has no EAGLE-3 draft");
  }
  // Whether the draft pass after a verify step of q rows a sequence should be uniform too (every sequence q
  // rows, those past its kept positions at slot -1, one logit row each): yes where the runner replays such
  // passes from CUDA graphs.
  virtual bool uniform_draft_extend() const { return false; }
  // Chain passes on the device (Eagle3Model::forward_chain): pass 0 starts from hidden ([R, H] f32), pass
  // j > 0 from pass j - 1's tokens and outputs; tokens[j][r] is pass j's token of row r.
  virtual void draft_chain(const std::vector<BatchDesc>& /*passes*/, const std::vector<float>& /*hidden*/,
                           std::vector<std::vector<int32_t>>* /*tokens*/) {
    KILN_FAIL("this model runner has no EAGLE-3 draft");
  }
  // Top-k tree drafting: each draft pass's logit rows also rank their k best draft tokens (DraftOut::
  // topk_tokens / topk_logprobs, Eagle3Model::set_topk's contract), 1 <= k <= 16. The default refuses any k
  // but 1 (top-1 only).
  virtual void set_draft_topk(int k) {
    KILN_CHECK(k == 1, "this model runner has no EAGLE-3 top-k drafting (draft top-k ", k, ")");
  }
  // KV slot moves after a token-tree verify step: the kept path's nodes sit at slots in node order and move
  // to the slots of the path's positions. For each i, the K/V of slot from[i] (page * page_size + offset) is
  // copied to slot to[i] in every layer of the target model and of the draft's KV cache, if any, as if every
  // slot were read before any is written (chains and cycles of moves work); a slot no move writes keeps its
  // value. Errors, with nothing changed: sizes differ, a slot out of range (named by its index), a slot
  // written by two moves (model/kv_cache.h KvCache::move_slots). Ordered after every step run or launched
  // before it and before every later one.
  virtual void move_kv(const std::vector<int64_t>& /*from*/, const std::vector<int64_t>& /*to*/) {
    KILN_FAIL("this model runner cannot move KV slots");
  }
  virtual void attach_images(uint64_t /*request*/, VlPromptLayout /*layout*/,
                             std::vector<vision::ImagePatches> /*images*/) {
    KILN_FAIL("this model runner takes no images");
  }
};

// Appends padding sequences until the batch has num_seqs of them: rows_per_seq tokens each (id 0, positions
// 0 .. rows_per_seq - 1, slot -1), kv_len rows_per_seq, page table all KvPool::kNullPage, no logit row (but
// in a verify step, rows_per_seq > 1, whose logit rows are every row: see is_uniform_verify); in a token
// tree, causal (window 0, masks 0). The cache write skips slot -1.
void pad_batch(BatchDesc& batch, int32_t num_seqs, int32_t rows_per_seq = 1);

// Whether every sequence of `batch` has exactly rows_per_seq (>= 2) new tokens and the logit rows are 0, 1,
// ..., R-1 (R <= the token count): the verify steps a CUDA graph per (bucket, rows_per_seq) can run, token
// trees by a tree graph (CudaDecodeGraph's tree), the rest by a plain one.
bool is_uniform_verify(const BatchDesc& batch, int32_t rows_per_seq);

// Whether every sequence of `batch` has exactly one new token, the logit rows are 0, 1, ..., R-1
// (R <= num_seqs) and it is no token tree (a draft pass of one frontier node a sequence has one row each):
// the decode-only steps a CUDA graph bucket can run, padded or not.
bool is_graphable_decode(const BatchDesc& batch);

// The default CUDA-graph batch sizes (SGLang's spacing up to 128).
std::vector<int32_t> default_graph_buckets();

}  // namespace kiln
