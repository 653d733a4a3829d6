// Eagle3Model: the EAGLE-3 draft (model/eagle3.h's layout and math) written against the ops API, so the CPU
// and CUDA backends run the same code, beside a Qwen3Model target whose step features it reads
// (Qwen3Model::set_aux_capture). model/eagle3.h's Eagle3Draft (f32) is the reference it is checked against.
//
// Its KV cache is one layer of paged K/V indexed by the target's page table: draft entry i of a sequence
// lives in the slot of the target's position i, so its pages come with the request, are rolled back with the
// target's (rejected drafts) and freed with it, and a page the prefix cache shares carries the draft entries
// of the positions it holds.
//
// One pass over T rows (a BatchDesc: tokens, positions, slots, cu_q, kv_lens, page table, logit rows; row t
// of a sequence at position p takes the token at p + 1, writes draft entry p and attends to entries [0, p]):
//   residual = fc(features) (first rows: target features [T, 3 Ht]) or the given hidden [T, H] (chain rows)
//   x = cat(rms_norm(embed(token)) * w_in, rms_norm(residual) * w_hidden)                 bf16 [T, 2 H]
//   q, k, v = x W_qkv^T; NeoX RoPE on q, k (the draft's rope_theta); K, V into the cache  (no Q/K norm)
//   residual += o_proj(paged_attention(q));  normed = rms_norm(residual) * w_post
//   residual += down(silu(gate(normed)) * up(normed));  normed = rms_norm(residual) * w_norm
// and per logit row: the draft's top-1 token through d2t (target ids; lowest draft id among equal maxima), or
// with set_topk(k > 1) its top k (ops::topk_rows: one launch, the top-1 its entry 0), and the midlayer output
// (residual) widened to f32, the next chain row's hidden state. Rounding points: the ops' (bf16 activations,
// f32 accumulation), so it matches the f32 reference within bf16 tolerance, not bitwise.
//
// Token trees (EAGLE tree drafting): a pass's batch may carry BatchDesc::tree_window / tree_mask, staged with
// the pass's other inputs; its attention then follows the masks (ops/attention.h), so a pass over a tree's
// frontier gives each row, bit for bit, what a chain pass over that row's path gives (on the CPU; on CUDA as
// the attention kernel's contract says). forward_features and forward_hidden take tree batches on both
// backends (always eagerly: the draft graphs take none); forward_chain takes none.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/batch.h"
#include "kiln/config.h"
#include "kiln/dtype.h"
#include "kiln/tensor.h"
#include "model/eagle3.h"
#include "model/kv_cache.h"
#include "ops/fp8_linear.h"

namespace kiln {

class Qwen3Model;

class Eagle3Model {
 public:
  // dir: config.json + *.safetensors of a LlamaForCausalLMEagle3 draft for `target` (the same vocabulary;
  // target_hidden_size = the target's hidden size). Without embed_tokens.weight the target's embeddings
  // serve (shared, as SpecForge ships). Errors name the file, field or tensor.
  static std::unique_ptr<Eagle3Model> load(const std::string& dir, const Qwen3Model& target);
  ~Eagle3Model();

  const Eagle3Config& config() const { return cfg_; }
  // The target layers whose entering residual streams are the features (eagle3_aux_layers).
  const std::array<int32_t, 3>& aux_layers() const { return aux_layers_; }
  // The draft's paged KV: one layer, the target's page count and size (bf16, `layout`).
  void allocate_kv(int32_t num_pages, int32_t page_size, ops::KvLayout layout);
  // K and V bytes of one token (the pool's sizing adds them to the target's).
  int64_t kv_bytes_per_token() const;

  struct Out {
    std::vector<int32_t> tokens;  // [R] the top-1 draft token of each logit row, as a target id
    std::vector<float> hidden;    // [R, H] the midlayer output of each logit row
    // set_topk(k) with k > 1 (else empty): per logit row its k best draft tokens (target ids) and their
    // log-probabilities, ops::topk_rows' contract (ops/argmax.h); entry 0 of a row is tokens[r].
    std::vector<int32_t> topk_tokens;  // [R, k]
    std::vector<float> topk_logprobs;  // [R, k]
    std::vector<float> logits;         // [R, Dv] the draft-vocabulary logits, with set_return_logits(true)
  };
  // The draft tokens forward_features and forward_hidden rank per logit row (Out::topk_*): 1 (the default:
  // top-1 only, Out::topk_* empty) to 16, at most the draft vocabulary. forward_chain stays top-1. Both
  // backends rank on their device (ops::topk_rows) and copy the rows back with the pass's other outputs.
  void set_topk(int k);
  int topk() const { return topk_; }
  // Tests and diagnostics: Out::logits is filled by forward_features and forward_hidden (on CUDA one more
  // copy back of [R, Dv] f32).
  void set_return_logits(bool on) { return_logits_ = on; }
  // The draft KV cache's slot moves, after a tree verify step (KvCache::move_slots' contract and errors).
  void move_kv(const std::vector<int64_t>& from, const std::vector<int64_t>& to);
  // A pass whose rows start from target features: row t takes features[rows[t]] (bf16 [N, 3 Ht] on the
  // model's device, e.g. Qwen3Model::aux_hidden()).
  void forward_features(const BatchDesc& batch, const Tensor& features, const std::vector<int32_t>& rows,
                        Out* out);
  // A pass whose rows start from hidden states [T, H] (host f32, bf16 values: an earlier pass's Out::hidden).
  void forward_hidden(const BatchDesc& batch, const std::vector<float>& hidden, Out* out);
  // A chain of passes on the device: pass 0 as forward_hidden(passes[0], hidden), and pass j > 0 takes pass
  // j - 1's top-1 tokens (its own batch's tokens are ignored) and midlayer outputs without leaving the
  // device. Every pass has R rows, one per sequence, the same sequences in the same order, logit rows 0 .. R
  // - 1 (a row whose chain ended earlier stays as padding: slot -1, its outputs ignored by the caller). One
  // copy back at the end: tokens[j][r], pass j's token of row r (target ids), bitwise those of forward_hidden
  // pass by pass (the same launches on the same bf16 values: Out::hidden is the exact widening of the
  // residual).
  void forward_chain(const std::vector<BatchDesc>& passes, const std::vector<float>& hidden,
                     std::vector<std::vector<int32_t>>* tokens);

  // CUDA: forward_chain's chains of at most the largest of `buckets` sequences whose page tables are at most
  // the widest of `widths` run padded to the next bucket (padding sequences: token 0 at slot -1, one key of
  // page 0, their tokens dropped) with every page table re-laid to the next width, from one CUDA graph per
  // (bucket, width, pass count), captured at its first chain and again after the workspace grew
  // (eagle3_draft_graphs.cpp); other chains run eagerly. A chain's tokens are the eager chain's of the padded
  // passes, bit for bit. So do forward_features' uniform passes (the engine's after a verify step: every
  // sequence q rows, 2 <= q <= max_extend_q, one logit row each): one graph per (bucket, width, q), padding
  // sequences of q rows at slot -1 (feature row 0), outputs bit for bit the eager pass's of the padded batch.
  // Longer uniform passes (a prompt's last chunk) run eagerly: a graph per prompt length would never be
  // replayed; so do token-tree passes. An extend graph is captured again after set_topk changed k.
  void prepare_draft_graphs(const std::vector<int32_t>& buckets, const std::vector<int32_t>& widths,
                            int32_t max_extend_q);
  int num_chain_graphs() const;   // chain graphs captured
  int num_extend_graphs() const;  // extend graphs captured
  bool has_graphs() const { return draft_graphs_ != nullptr; }

 private:
  struct Workspace;
  class DraftGraphs;
  Eagle3Model() = default;
  // Validates the pass and uploads its inputs (and the feature rows or the hidden states) in one batch.
  void stage(const BatchDesc& batch, const std::vector<int32_t>* src_rows, const std::vector<bf16_t>* hidden);
  void run_midlayer(const BatchDesc& batch, Out* out);
  // run_midlayer's launches over T > 0 rows (the shortest sequence min_q_len rows) and R logit rows, on the
  // views stage() made: no allocation once the workspace holds T rows, no host synchronisation (capturable).
  // The logit rows' top-1 tokens go to `tokens` (device i32 [R]; null: the out buffer read_out copies back),
  // their midlayer outputs to the out buffer unless !hidden_rows (a chain pass keeps them in the residual).
  void launch_midlayer(int64_t T, int64_t R, int32_t min_q_len, int32_t* tokens = nullptr,
                       bool hidden_rows = true);
  // forward_features' launches over T > 0 staged rows (R logit rows, the shortest sequence min_q_len rows):
  // the feature rows through fc, then launch_midlayer. Capturable as launch_midlayer is.
  void launch_features(const Tensor& features, int64_t T, int64_t R, int32_t min_q_len);
  // forward_features through an extend graph where one serves it (eagle3_draft_graphs.cpp); false: eager.
  bool run_extend_graph(const BatchDesc& batch, const Tensor& features, const std::vector<int32_t>& rows,
                        Out* out);
  // forward_chain through a chain graph where one serves it (eagle3_draft_graphs.cpp); false: eager.
  bool run_chain_graph(const std::vector<BatchDesc>& passes, const std::vector<bf16_t>& hidden,
                       std::vector<std::vector<int32_t>>* tokens);
  // forward_chain's inputs, all passes in one upload: pass 0's tokens, every pass's positions, slots, lengths
  // and page table (each at its own width), the common cu_q and logit rows, the hidden states into the
  // residual; sizes the chain's token rows [passes, R].
  void stage_chain(const std::vector<BatchDesc>& passes, const std::vector<bf16_t>& hidden);
  // The staged chain's passes over R rows each, pass j's tokens into chain token row j (pass j + 1's ids): no
  // allocation once staged, no host synchronisation (capturable).
  void launch_chain(int64_t R, size_t passes);
  // The first R of each pass's `rows` tokens, copied back in one copy.
  void read_chain(int64_t rows, int64_t R, size_t passes, std::vector<std::vector<int32_t>>* tokens);
  // The first `keep` (<= R) of the R logit rows' top-1 draft tokens (or top k) and midlayer outputs, copied
  // back (one copy) after launch_midlayer; with set_return_logits their logits too (a second copy).
  void read_out(int64_t R, Out* out, int64_t keep = -1);
  uint64_t ws_generation() const;  // bumped by every workspace reallocation (a captured graph is then stale)

  Eagle3Config cfg_;
  ModelConfig kv_cfg_;  // one layer of the draft's KV heads and head dim (KvCache's shape)
  std::array<int32_t, 3> aux_layers_{};
  Device device_ = Device::cpu();
  int64_t max_position_ = 0;
  std::vector<Buffer> owned_;  // the weights' device storage
  Tensor fc_, w_in_, w_hidden_, w_post_, w_norm_, lm_head_, embed_;
  ops::LinearWeight qkv_, o_, gate_up_, down_;
  Tensor d2t_dev_;  // i64 [draft vocab] on the model's device: d2t, argmax_rows' and topk_rows' offsets
  int topk_ = 1;
  bool return_logits_ = false;
  Buffer rope_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Workspace> ws_;
  std::unique_ptr<DraftGraphs> draft_graphs_;  // prepare_draft_graphs (CUDA)
};

}  // namespace kiln
