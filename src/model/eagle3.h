// Eagle3Draft: an EAGLE-3 draft checkpoint as the hub and SpecForge ship it (architectures
// ["LlamaForCausalLMEagle3"]; scripts/train_eagle3_draft.py writes one), run on the CPU in f32: the reference
// the CUDA drafter is to be checked against.
//
// Weights (bf16 or f32 in the file, widened to f32 once at load):
//   fc.weight                                   [H, 3 Ht]  over cat(h_low, h_mid, h_high) of the target
//   midlayer.input_layernorm.weight             [H]        normalises the token embedding
//   midlayer.hidden_norm.weight                 [H]        normalises the hidden state
//   midlayer.self_attn.{q,k,v}_proj.weight      [Hq D | Hkv D, 2 H] over cat(normed embedding, normed hidden)
//   midlayer.self_attn.o_proj.weight            [H, Hq D]
//   midlayer.post_attention_layernorm.weight    [H]
//   midlayer.mlp.{gate,up}_proj.weight [I, H], down_proj.weight [H, I]
//   norm.weight [H], lm_head.weight [Dv, H], d2t i64 [Dv] (target id = draft id + d2t[draft id])
//   embed_tokens.weight [V, H] when the file has it; else the target's embeddings (shared, as SpecForge
//   ships)
// The target's three hidden states are the residual stream entering layers aux_layers (eagle_config.
// eagle_aux_hidden_state_layer_ids; default SGLang's and vLLM's (2, L / 2, L - 3) for a target of L layers).
//
// One midlayer row at rotary position p: residual = hidden; x = cat(rms(embed(token)) * w_in,
// rms(hidden) * w_hidden); q, k, v = x W^T (NeoX half-split RoPE on q and k at p, theta rope_theta); the row
// attends causally to the draft's own KV entries [0, p] (GQA, softmax in f32); h = residual + o_proj(attn);
// out = h + down(silu(gate(x')) * up(x')) with x' = rms(h) * w_post; logits = lm_head(rms(out) * w_norm) over
// the draft vocabulary. Chain drafting (Leviathan-style, top-1): the first row takes fc(target features at
// t) with the token after t; each next row takes the previous row's out and the token it drafted.
// Numerics: f32 throughout, dot products in ascending index order, RMSNorm as transformers' Llama (x * rsqrt(
// mean(x^2) + eps), then the weight), exp/cos/sin from <cmath>: a reference, bitwise independent of how rows
// are grouped into calls.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kiln {

struct Eagle3Config {
  int64_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t vocab = 0, draft_vocab = 0, target_hidden = 0;
  double eps = 1e-6, rope_theta = 10000.0;
  std::vector<int32_t> aux_layers;  // empty: the default for the target's layer count (aux_layers_for)
};

// config.json of a LlamaForCausalLMEagle3 draft; throws kiln::Error naming the bad field.
Eagle3Config parse_eagle3_config(const std::string& json_text, const std::string& source_name);
// The three target layers whose entering residual streams the draft reads: cfg.aux_layers, or (2, L / 2, L -
// 3).
std::array<int32_t, 3> eagle3_aux_layers(const Eagle3Config& cfg, int64_t target_layers);

// One sequence's draft KV: f32 [len, Hkv, D] keys and values, entry i at rotary position i.
struct Eagle3Kv {
  std::vector<float> k, v;
  int64_t len = 0;
  void truncate(int64_t n);  // drop entries from n on (rejected drafts)
};

class Eagle3Draft {
 public:
  // dir: config.json + *.safetensors. target_embed: the target's embedding rows f32 [V, H] when the draft has
  // no embed_tokens.weight (empty otherwise; ignored when the draft has its own).
  static std::unique_ptr<Eagle3Draft> load(const std::string& dir, std::vector<float> target_embed = {});

  const Eagle3Config& config() const { return cfg_; }
  // Target features [T, 3 Ht] -> the first rows' hidden states [T, H] (fc).
  std::vector<float> project_features(std::span<const float> features) const;
  // T rows of one sequence at rotary positions kv.len, kv.len + 1, ...: token ids (target vocabulary) and
  // hidden states [T, H]. Appends their K/V to kv; writes the midlayer outputs [T, H] to *out and, when
  // non-null, the draft-vocabulary logits [T, Dv] to *logits.
  void forward(Eagle3Kv& kv, std::span<const int32_t> tokens, std::span<const float> hidden,
               std::vector<float>* out, std::vector<float>* logits) const;
  // Target id of a draft-vocabulary id (d2t); throws when out of range.
  int32_t target_token(int32_t draft_id) const;
  // Chain drafting, top-1: from the midlayer output `hidden` [H] of the row at position kv.len - 1 (the last
  // context row, whose argmax token is drafts[0]), k drafted target ids. Each draft after the first appends
  // one row (the previous output and the previous draft) to kv: the caller truncates kv back after verifying.
  std::vector<int32_t> chain(Eagle3Kv& kv, std::span<const float> hidden, std::span<const float> logits,
                             int32_t k) const;

 private:
  Eagle3Draft() = default;
  Eagle3Config cfg_;
  std::vector<float> fc_, w_in_, w_hidden_, q_, k_, v_, o_, w_post_, gate_, up_, down_, w_norm_, lm_head_,
      embed_;
  std::vector<int64_t> d2t_;
  std::vector<float> inv_freq_;  // [D / 2]
};

}  // namespace kiln
