// Qwen3 decoder (dense; also the Qwen3-VL text decoder and Qwen3-Embedding), written once against the
// ops API so every backend runs the same code. One layer:
//   h = x + o_proj(paged_attention(attn_prep(qkv_proj(rms_norm(x)))))      (fused residual add + norm)
//   y = h + down_proj(silu_and_mul(gate_up_proj(rms_norm(h))))
// and logits = lm_head(rms_norm(y)) for the rows the batch asks for.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/batch.h"
#include "kiln/config.h"
#include "kiln/tensor.h"
#include "model/kv_cache.h"
#include "model/qwen3_vl_vision.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"

namespace kiln {

enum class LoadFormat : uint8_t {
  real,    // the checkpoint's safetensors
  random,  // config.json shapes, weights from fill_random_weight(seed): benchmarks without weights
};

struct LoadOptions {
  Device device = Device::cpu();
  LoadFormat load_format = LoadFormat::real;
  uint64_t seed = 0;
  int64_t max_position = 0;  // rows of the rotary table; 0 = config.max_context()
  bool is_embedding =
      false;  // serve a generation checkpoint as an embedding model (kiln/config.h force_embedding)
  // --quantization (vLLM's flag): "" or "none" keeps the checkpoint's storage; "fp8" quantizes its bf16
  // linears at load into block-FP8 (a checkpoint already in FP8 is taken as it is). Anything else is refused.
  std::string quantization;
  // Tensor parallelism: load and run this rank's slice (model/tensor_parallel.h; copied into the model).
  // Null: the whole model, no collectives.
  const TpShard* tp = nullptr;
};

// Qwen3-VL: the image-token rows of one step. Their input embeddings are replaced by the vision tower's
// merged rows (HF: inputs_embeds.masked_scatter) and, after decoder layer l < deepstack layers, deepstack[l]
// is added to their hidden states (HF: _deepstack_process, a bf16 add) before the next norm.
struct VisualInput {
  std::vector<int32_t> rows;      // [n] token rows of the step, ascending, distinct
  std::vector<bf16_t> embeds;     // [n, hidden] host memory
  std::vector<bf16_t> deepstack;  // [layers, n, hidden] host memory
  int32_t deepstack_layers = 0;
  bool empty() const { return rows.empty(); }
};

class Qwen3Model {
 public:
  // Reads DIR/config.json and, for LoadFormat::real, DIR's safetensors. Errors name the file and field.
  static std::unique_ptr<Qwen3Model> load(const std::string& dir, const LoadOptions& opts);
  // From a config already in hand (tests): weights from `ckpt`, or random when it is null.
  static std::unique_ptr<Qwen3Model> create(const ModelConfig& cfg, const Checkpoint* ckpt,
                                            const LoadOptions& opts);
  ~Qwen3Model();

  const ModelConfig& config() const { return cfg_; }
  Device device() const { return opts_.device; }
  int64_t max_position() const { return max_position_; }
  const Qwen3Weights& weights() const { return weights_; }
  // Tensor parallelism: this rank's shard (config() is then shard_config's), else null.
  const TpShard* tp() const { return tp_ ? &*tp_ : nullptr; }

  // One step. batch must satisfy BatchDesc::validate against this model and cache (checked here, with the
  // positions against the rotary table); its new tokens' K/V are written into `cache`. Not reentrant: the
  // per-step workspace is shared, so one thread (the engine's) calls forward / forward_hidden at a time.
  // logits: f32 [R, vocab] on the model's device, R = batch.logit_rows.size(), row r for logit_rows[r].
  // visual: the step's image-token rows (Qwen3-VL), or null. A token-tree batch (kiln/batch.h tree_window /
  // tree_mask: rotary positions by depth, context slots by node order) runs on both backends, on CUDA eagerly
  // only (CudaDecodeGraph refuses it).
  void forward(const BatchDesc& batch, KvCache& cache, const Tensor& logits,
               const VisualInput* visual = nullptr);
  // The same step, returning the final-norm hidden state of the logit rows instead of logits (the
  // embedding path): out bf16 or f32 [R, hidden] on the model's device.
  void forward_hidden(const BatchDesc& batch, KvCache& cache, const Tensor& out,
                      const VisualInput* visual = nullptr);
  // The LM head over `rows` (i32 [n] on the model's device, each in [0, T) of the last forward's T token
  // rows) of that forward's final-norm hidden states, into logits f32 [n, vocab]: more logit rows of a step
  // after it ran (prompt log-probabilities, runtime/prompt_logprobs.h). Not for a tensor-parallel shard.
  void lm_head_rows(const Tensor& rows, const Tensor& logits);
  // Qwen3-VL's vision tower (on the model's device); null for text-only models.
  const Qwen3VLVision* vision() const { return vision_.get(); }
  // Grows the per-step workspace to fit any step of up to `tokens` tokens, `seqs` sequences, a page table
  // `pages_stride` wide and `logit_rows` logit rows, so such steps reallocate nothing and CUDA graphs
  // captured after this call are not recaptured (model/cuda_graph.h).
  void reserve_workspace(int64_t tokens, int64_t seqs, int64_t pages_stride, int64_t logit_rows);
  // EAGLE-3's features (model/eagle3_model.h): from now on every step also copies the residual stream
  // entering layers[0], layers[1] and layers[2] (HF's hidden_states[l]; the embeddings for l = 0) of all its
  // T token rows into aux_hidden() bf16 [T, 3 hidden], column block i for layers[i], inside launch_layers (so
  // a CUDA graph captured afterwards copies them too). Call before reserve_workspace and any graph capture.
  // Empty: off. Not on a tensor-parallel shard.
  void set_aux_capture(const std::vector<int32_t>& layers);
  bool aux_capture() const { return !aux_layers_.empty(); }
  Tensor aux_hidden() const;  // of the last step; valid until the next one

 private:
  struct Workspace;
  Qwen3Model(const ModelConfig& cfg, Qwen3Weights weights, std::unique_ptr<Qwen3VLVision> vision,
             const LoadOptions& opts);
  // Runs every layer and the final norm; the final-norm hidden states are left in the workspace.
  void run_layers(const BatchDesc& batch, KvCache& cache, const VisualInput* visual);
  // Uploads a step's visual rows into the workspace (none: clears them); after stage().
  void stage_visual(const VisualInput* visual);
  // run_layers in two halves: stage validates the batch and uploads its metadata into the workspace;
  // launch_layers issues the ops only (no sync, no allocation: what a CUDA graph captures).
  void stage(const BatchDesc& batch, KvCache& cache);
  // The device copy of the staged batch's token ids (i32 [T]), valid until the next stage().
  void* staged_token_ids() const;
  // Forgets the staged step's host bounds that change with its context lengths (the fp8 cache's prefill
  // staging size), so launch_layers' launches hold for any step of the same shape: a verify graph.
  void drop_per_step_attention_bounds();
  void launch_layers(KvCache& cache);
  // The LM head over the staged logit rows of the last step.
  void launch_lm_head(const Tensor& logits);
  // A verify step's (attention's decode_rows_per_seq >= 2) sequence count, whose plain decode step's GEMV
  // tactics its projections and LM head run (ops::LinearTacticRows: the plain step's logits, bitwise); else
  // 0.
  int64_t verify_tactic_rows() const;
  uint64_t workspace_generation() const;  // changes whenever a workspace buffer is reallocated
  friend class CudaDecodeGraph;           // model/cuda_graph.h: captures launch_layers + the LM head

  ModelConfig cfg_;
  LoadOptions opts_;
  Qwen3Weights weights_;
  Buffer rope_buf_;
  int64_t max_position_ = 0;
  std::unique_ptr<Workspace> ws_;
  std::unique_ptr<Qwen3VLVision> vision_;
  std::optional<TpShard> tp_;
  std::vector<int32_t> aux_layers_;  // set_aux_capture
};

}  // namespace kiln
