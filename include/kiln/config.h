// ModelConfig: what kiln needs from a Hugging Face config.json (Qwen3 family).
// Parsed by io/config.cpp; both the transformers 4.x layout (top-level rope_theta, torch_dtype) and the
// 5.x layout (rope_parameters {rope_theta, rope_type}, dtype) are read.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/rope.h"

namespace kiln {

enum class ModelArch : uint8_t { qwen3, qwen3_vl_text, qwen3_embedding, qwen3_moe };

// How an embedding model turns the final hidden states of a prompt into one vector (sentence-transformers'
// Pooling module; Qwen3-Embedding pools the last token, i.e. its appended <|endoftext|>).
enum class EmbeddingPooling : uint8_t { last_token, mean, cls };

// Qwen3-VL's vision tower (config.json vision_config; transformers' Qwen3VLVisionConfig defaults where a
// field is absent) and the token ids the processor puts around each image (top-level config fields).
struct VisionConfig {
  int64_t depth = 27;
  int64_t hidden_size = 1152;
  std::string hidden_act = "gelu_pytorch_tanh";  // the blocks' MLP: gelu_pytorch_tanh (tanh GELU) or gelu
  int64_t intermediate_size = 4304;
  int64_t num_heads = 16;
  int64_t in_channels = 3;
  int64_t patch_size = 16;
  int64_t spatial_merge_size = 2;
  int64_t temporal_patch_size = 2;
  int64_t out_hidden_size = 3584;          // the decoder's hidden size
  int64_t num_position_embeddings = 2304;  // a square grid of learned positions (48 x 48)
  std::vector<int64_t> deepstack_visual_indexes = {8, 16, 24};
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t vision_start_token_id = 151652;
  int64_t vision_end_token_id = 151653;

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t merged_dim() const { return hidden_size * spatial_merge_size * spatial_merge_size; }
  int64_t grid_side() const;  // sqrt(num_position_embeddings)
};

// Qwen3-MoE (Qwen3MoeForCausalLM) and Qwen3-VL-MoE's text decoder: the sparse MLP and the layers that have
// it. num_experts == 0: no sparse layer (every MLP is the dense intermediate_size SwiGLU).
// router_aux_loss_coef and output_router_logits (training only) are read by nobody.
struct MoeConfig {
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;  // top-k, in [1, num_experts]
  int64_t moe_intermediate_size = 0;
  int64_t decoder_sparse_step = 1;       // >= 1
  std::vector<int64_t> mlp_only_layers;  // layers in [0, num_layers) that keep the dense MLP
  bool norm_topk_prob = false;           // renormalize the chosen experts' probabilities to sum to 1
};

// How the checkpoint's linear layers are stored (config.json quantization_config; docs/NUMERICS.md "Block-FP8
// linear layers"). kiln reads one scheme: Qwen's -FP8 releases, {"quant_method": "fp8", "fmt": "e4m3",
// "activation_scheme": "dynamic", "weight_block_size": [128, 128]}. Any other is refused at parse time.
struct QuantConfig {
  std::string method;                               // "" (bf16 checkpoint) or "fp8"
  std::vector<std::string> modules_to_not_convert;  // substrings of module names kept bf16
  // --quantization fp8: quantize this bf16 checkpoint's linears at load into the same block format.
  bool online = false;
  bool fp8() const { return method == "fp8" || online; }
  // "none", "fp8 (checkpoint: e4m3, 128x128 blocks, dynamic activations)" or "fp8 (online ...)".
  std::string describe() const;
};

// Bounds on what config.json may claim, far above any real checkpoint (vocabularies ~256k, contexts ~1M):
// past them, a clear error naming the field instead of an allocation that fails as a bare std::bad_alloc.
inline constexpr int64_t kMaxVocabSize = int64_t(1) << 24;      // 16,777,216 token ids
inline constexpr int64_t kMaxContextTokens = int64_t(1) << 22;  // 4,194,304 positions (the rotary table)

struct ModelConfig {
  ModelArch arch = ModelArch::qwen3;
  std::string architecture;  // as written in config.json, e.g. "Qwen3ForCausalLM"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // key/value heads (GQA)
  int64_t head_dim = 0;      // explicit in Qwen3 configs; hidden/num_heads when absent
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  std::string rope_type = "default";   // as written ("mrope" reads as "default")
  RopeScaling rope_scaling;            // resolved from rope_type and its fields
  double partial_rotary_factor = 1.0;  // rotary_dim = head_dim * factor
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  DType dtype = DType::bf16;  // torch_dtype / dtype
  // Multimodal RoPE (Qwen3-VL text decoder). Empty section: plain RoPE.
  std::vector<int> mrope_section;  // e.g. {24, 20, 20}, sums to rotary_dim / 2
  bool mrope_interleaved = false;  // Qwen3-VL: interleaved axis map; Qwen2.5-VL: sectioned
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;
  // Embedding models (arch qwen3_embedding): the pooling, and whether the vector is L2-normalised (a
  // Normalize module; Qwen3Model checkpoints without modules.json: last token, normalised).
  EmbeddingPooling pooling = EmbeddingPooling::last_token;
  bool normalize_embeddings = true;
  std::string embedding_source;  // "modules.json", "architectures" or "--is-embedding"; "" for generators
  // Qwen3-VL: the vision tower (weights under "model.visual."); has_vision false for text-only models.
  bool has_vision = false;
  VisionConfig vision;
  QuantConfig quant;
  // Prefix of the decoder's weight names: "model." for Qwen3, "model.language_model." for Qwen3-VL.
  std::string weight_prefix = "model.";
  // Qwen3-MoE and Qwen3-VL-MoE: the sparse MLP (num_experts 0 for every other architecture).
  MoeConfig moe;

  // The longest context the model serves: YaRN original_max_position x factor and linear
  // max_position_embeddings x factor (as vLLM and SGLang derive it), else max_position_embeddings.
  int64_t max_context() const;
  int64_t rotary_dim() const { return int64_t(double(head_dim) * partial_rotary_factor + 0.5); }
  int64_t q_size() const { return num_heads * head_dim; }
  int64_t kv_size() const { return num_kv_heads * head_dim; }
  // Whether layer l runs the sparse MLP, by transformers' Qwen3MoeDecoderLayer rule: l not in
  // mlp_only_layers, num_experts > 0 and (l + 1) % decoder_sparse_step == 0.
  bool is_moe_layer(int64_t l) const;
  bool has_moe_layers() const;
};

// Reads DIR/config.json. Throws kiln::Error naming the file and the field on anything wrong:
// unknown architecture, missing or non-positive sizes, heads not dividing, mrope_section not summing.
//   architectures[0]: Qwen3ForCausalLM -> qwen3 ("model."), Qwen3Model -> qwen3_embedding (""),
//   Qwen3VLForConditionalGeneration -> qwen3_vl_text (its text_config; "model.language_model."), with its
//   vision_config (has_vision; depth, widths, patch/merge sizes, deepstack_visual_indexes, hidden_act
//   gelu_pytorch_tanh or gelu) and image/video/vision_start/vision_end token ids; without a vision_config
//   or with image token ids outside the vocabulary, only the text decoder is loaded (has_vision false).
//   rope: rope_parameters (5.x) or rope_theta + rope_scaling (4.x); rope_type "default" (or the older
//   "mrope"), "yarn" (factor, original_max_position_embeddings, attention_factor | mscale + mscale_all_dim,
//   beta_fast, beta_slow, truncate), "linear" and "dynamic" (factor); others (longrope, llama3) are rejected.
//   Qwen3MoeForCausalLM (model_type qwen3_moe) -> qwen3_moe ("model."), with num_experts (or
//   num_local_experts), num_experts_per_tok (<= num_experts), moe_intermediate_size, decoder_sparse_step
//   (>= 1, default 1), mlp_only_layers (indexes in [0, num_hidden_layers)) and norm_topk_prob (default
//   false). Qwen3VLMoeForConditionalGeneration (model_type qwen3_vl_moe: Qwen3-VL-30B-A3B, -235B-A22B) ->
//   qwen3_vl_text as Qwen3-VL, with text_config's sparse-MLP fields read as Qwen3-MoE's (the same checks);
//   norm_topk_prob is always true there (transformers' Qwen3-VL-MoE router renormalizes unconditionally).
//   Attention layout: layer_types must have num_hidden_layers entries; a layer that would slide a
//   window (use_sliding_window) is rejected, and so are attention_bias and a hidden_act other than silu.
//   dtype: "dtype" (5.x) or "torch_dtype" (4.x), bfloat16/float16/float32; eos_token_id: int or list.
//   quantization_config (top level, or text_config's for Qwen3-VL): quant_method "fp8" with fmt "e4m3" (the
//   default), activation_scheme "dynamic" (the default), weight_block_size [128, 128] (the default) and an
//   optional modules_to_not_convert list; any other quant_method (awq, gptq, compressed-tensors,
//   bitsandbytes, ...), fmt, block size or a "static" activation scheme is rejected naming the value.
//   DIR/modules.json (sentence-transformers): the model is an embedding model (whatever architectures says),
//   with the Pooling module's mode (lasttoken, mean or cls) and a Normalize module's L2 normalisation; any
//   other module (Dense, ...) or pooling mode is rejected naming the file.
ModelConfig load_model_config(const std::string& model_dir);
ModelConfig parse_model_config(const std::string& json_text, const std::string& source_name);
// Reads DIR/modules.json and the Pooling module's config into cfg (no-op when modules.json is absent).
void apply_sentence_transformers(const std::string& model_dir, ModelConfig& cfg);
// SGLang's --is-embedding: serve a checkpoint that does not say it is one (Qwen3ForCausalLM) as an embedding
// model -- last-token pooling, normalised, unless modules.json said otherwise. Rejects Qwen3-VL.
void force_embedding(ModelConfig& cfg);

// The config cannot always tell where the decoder's weights live (Qwen3-Embedding ships as "Qwen3ForCausalLM"
// with unprefixed names). Keeps cfg.weight_prefix when PREFIX + "embed_tokens.weight" is among the names,
// else switches to the known prefix that is ("model.", "", "model.language_model.", "language_model.model.");
// throws when none is.
void adapt_weight_prefix(ModelConfig& cfg, const std::vector<std::string>& tensor_names);

}  // namespace kiln
