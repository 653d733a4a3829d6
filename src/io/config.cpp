// HF config.json -> ModelConfig for the Qwen3 family (transformers 4.x and 5.x layouts).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "kiln/config.h"
#include "kiln/error.h"

namespace kiln {

namespace {

using json = nlohmann::json;

// Typed field access on one JSON object; errors name the file and the dotted field path.
class Fields {
 public:
  Fields(const json& obj, std::string source, std::string prefix)
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const json* find(const std::string& key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  std::string path(const std::string& key) const { return prefix_ + key; }
  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    KILN_FAIL(source_, ": field '", path(key), "' ", why);
  }

  std::optional<int64_t> opt_int(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) fail(key, "must be an integer, got " + v->dump());
    return v->get<int64_t>();
  }
  int64_t positive(const std::string& key) const {
    const auto v = opt_int(key);
    if (!v) fail(key, "is missing");
    if (*v <= 0) fail(key, "must be positive, got " + std::to_string(*v));
    return *v;
  }
  int64_t positive_at_most(const std::string& key, int64_t max) const {
    const int64_t v = positive(key);
    if (v > max) fail(key, "is " + std::to_string(v) + ", past kiln's limit of " + std::to_string(max));
    return v;
  }
  std::optional<double> opt_num(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) fail(key, "must be a number, got " + v->dump());
    const double d = v->get<double>();
    if (!std::isfinite(d)) fail(key, "must be finite");
    return d;
  }
  std::optional<bool> opt_bool(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) fail(key, "must be true or false, got " + v->dump());
    return v->get<bool>();
  }
  std::optional<std::string> opt_str(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) fail(key, "must be a string, got " + v->dump());
    return v->get<std::string>();
  }
  // An int or a list of ints (eos_token_id).
  std::optional<std::vector<int64_t>> opt_int_list(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    std::vector<int64_t> out;
    if (v->is_number_integer()) {
      out.push_back(v->get<int64_t>());
    } else if (v->is_array()) {
      for (const json& e : *v) {
        if (!e.is_number_integer()) fail(key, "must be an integer or a list of integers, got " + v->dump());
        out.push_back(e.get<int64_t>());
      }
    } else {
      fail(key, "must be an integer or a list of integers, got " + v->dump());
    }
    return out;
  }
  const json& object() const { return obj_; }
  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

DType parse_dtype(const Fields& f, const std::string& key, const std::string& s) {
  if (s == "bfloat16") return DType::bf16;
  if (s == "float16" || s == "half") return DType::f16;
  if (s == "float32" || s == "float") return DType::f32;
  f.fail(key, "names an unsupported dtype \"" + s + "\" (bfloat16, float16 or float32)");
}

// transformers' get_mscale: YaRN's attention factor for a context extension of `scale`.
double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The scaling fields of one rope block (rope_parameters or rope_scaling), as transformers 5 reads them.
void parse_rope_scaling(const Fields& r, ModelConfig& c) {
  RopeScaling& s = c.rope_scaling;
  if (c.rope_type == "default") return;
  if (c.rope_type == "linear" || c.rope_type == "dynamic" || c.rope_type == "yarn") {
    s.kind = c.rope_type == "linear"    ? RopeScalingKind::linear
             : c.rope_type == "dynamic" ? RopeScalingKind::dynamic
                                        : RopeScalingKind::yarn;
  } else {
    r.fail("rope_type",
           "\"" + c.rope_type + "\" is not supported (default, mrope, yarn, linear and dynamic are)");
  }
  const std::optional<double> factor = r.opt_num("factor");
  const std::optional<int64_t> original = r.opt_int("original_max_position_embeddings");
  if (original && *original <= 0) r.fail("original_max_position_embeddings", "must be positive");
  if (factor) {
    s.factor = *factor;
  } else if (s.kind == RopeScalingKind::yarn && original && c.max_position_embeddings > 0) {
    s.factor = double(c.max_position_embeddings) / double(*original);  // transformers' implicit factor
  } else {
    r.fail("factor", "is missing (rope_type \"" + c.rope_type + "\" needs it)");
  }
  if (!(s.factor >= 1)) r.fail("factor", "must be >= 1, got " + std::to_string(s.factor));
  if (s.kind != RopeScalingKind::yarn) return;

  s.original_max_position = original ? *original : c.max_position_embeddings;
  if (s.original_max_position <= 0)
    r.fail("original_max_position_embeddings", "is missing and so is max_position_embeddings");
  // transformers reads these with `or`: 0 / null fall back to the paper's 32 and 1.
  if (auto b = r.opt_num("beta_fast"); b && *b != 0) s.beta_fast = *b;
  if (auto b = r.opt_num("beta_slow"); b && *b != 0) s.beta_slow = *b;
  if (!(s.beta_fast > 0)) r.fail("beta_fast", "must be positive");
  if (!(s.beta_slow > 0)) r.fail("beta_slow", "must be positive");
  if (auto t = r.opt_bool("truncate")) s.truncate = *t;
  if (auto a = r.opt_num("attention_factor")) {
    if (!(*a > 0)) r.fail("attention_factor", "must be positive");
    s.attention_factor = *a;
  } else {
    const double ms = r.opt_num("mscale").value_or(0), ms_all = r.opt_num("mscale_all_dim").value_or(0);
    s.attention_factor = ms != 0 && ms_all != 0 ? yarn_mscale(s.factor, ms) / yarn_mscale(s.factor, ms_all)
                                                : yarn_mscale(s.factor, 1.0);
  }
}

// The rope block: 5.x rope_parameters {rope_theta, rope_type, partial_rotary_factor?, mrope_*, scaling
// fields}, or 4.x top-level rope_theta with an optional rope_scaling {type|rope_type, scaling fields,
// mrope_section, mrope_interleaved}. When a config carries both, the one that names a scaling wins.
void parse_rope(const Fields& f, ModelConfig& c) {
  const char* block_key = f.find("rope_parameters") ? "rope_parameters" : "rope_scaling";
  auto type_of = [&](const char* key) -> std::string {
    const json* b = f.find(key);
    if (!b || !b->is_object()) return "default";
    const Fields r(*b, f.source(), f.path(key) + ".");
    std::optional<std::string> t = r.opt_str("rope_type");
    if (!t) t = r.opt_str("type");
    return t ? *t : "default";
  };
  if (f.find("rope_parameters") && f.find("rope_scaling")) {
    const std::string a = type_of("rope_parameters"), b = type_of("rope_scaling");
    const bool plain_a = a == "default" || a == "mrope", plain_b = b == "default" || b == "mrope";
    if (!plain_a && !plain_b && a != b)
      f.fail("rope_scaling", "says rope_type \"" + b + "\" but rope_parameters says \"" + a + "\"");
    if (plain_a && !plain_b) block_key = "rope_scaling";
  }
  if (auto t = f.opt_num("rope_theta")) c.rope_theta = *t;
  if (auto p = f.opt_num("partial_rotary_factor")) c.partial_rotary_factor = *p;
  if (const json* block = f.find(block_key)) {
    if (!block->is_object()) f.fail(block_key, "must be an object, got " + block->dump());
    const Fields r(*block, f.source(), f.path(block_key) + ".");
    if (auto t = r.opt_num("rope_theta")) c.rope_theta = *t;
    if (auto p = r.opt_num("partial_rotary_factor")) c.partial_rotary_factor = *p;
    std::optional<std::string> type = r.opt_str("rope_type");
    if (!type) type = r.opt_str("type");
    if (type) c.rope_type = *type;
    // Qwen2-VL-era configs spell M-RoPE as type "mrope"; the rotation itself is the default one.
    if (c.rope_type == "mrope") c.rope_type = "default";
    parse_rope_scaling(r, c);
    if (const json* sec = r.find("mrope_section")) {
      if (!sec->is_array() || sec->size() != 3)
        r.fail("mrope_section", "must be a list of 3 integers (t, h, w)");
      for (const json& e : *sec) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0)
          r.fail("mrope_section", "must hold non-negative integers, got " + sec->dump());
        c.mrope_section.push_back(e.get<int>());
      }
    }
    if (auto il = r.opt_bool("mrope_interleaved")) c.mrope_interleaved = *il;
  }
  if (!(c.rope_theta > 0)) f.fail("rope_theta", "must be positive");
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
    f.fail("partial_rotary_factor", "must be in (0, 1]");
}

// kiln runs full causal attention in every layer and the plain SiLU MLP without biases. transformers' Qwen3
// slides a window in layer i when layer_types[i] is "sliding_attention" (derived, when the list is absent,
// as i >= max_window_layers) and the window is on (use_sliding_window with a sliding_window size); such a
// config is refused, naming the field, rather than served with the wrong attention.
void check_layer_layout(const Fields& f, const ModelConfig& c) {
  const std::string L = std::to_string(c.num_layers);
  const bool window_on = f.opt_bool("use_sliding_window").value_or(false) && f.opt_int("sliding_window");
  if (auto w = f.opt_int("sliding_window"); w && *w <= 0)
    f.fail("sliding_window", "must be positive or null, got " + std::to_string(*w));
  const std::optional<int64_t> max_window_layers = f.opt_int("max_window_layers");
  if (max_window_layers && *max_window_layers < 0) f.fail("max_window_layers", "must not be negative");
  if (const json* lt = f.find("layer_types")) {
    if (!lt->is_array()) f.fail("layer_types", "must be a list of strings, got " + lt->dump());
    if (int64_t(lt->size()) != c.num_layers)
      f.fail("layer_types", "has " + std::to_string(lt->size()) + " entries, but num_hidden_layers is " + L);
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& t = (*lt)[i];
      const std::string key = "layer_types[" + std::to_string(i) + "]";
      if (!t.is_string()) f.fail(key, "must be a string, got " + t.dump());
      const std::string v = t.get<std::string>();
      if (v == "sliding_attention" && window_on)
        f.fail(key,
               "is \"sliding_attention\" with use_sliding_window on: kiln does not implement "
               "sliding-window attention");
      if (v != "full_attention" && v != "sliding_attention")
        f.fail(key, "is \"" + v + "\" (full_attention or sliding_attention)");
    }
  } else if (window_on && max_window_layers.value_or(28) < c.num_layers) {
    // Qwen3Config's default max_window_layers is 28.
    f.fail("use_sliding_window",
           "is true and max_window_layers (" + std::to_string(max_window_layers.value_or(28)) +
               ") < num_hidden_layers (" + L +
               "): those layers would use sliding-window attention, which kiln does not "
               "implement");
  }
  if (f.opt_bool("attention_bias").value_or(false))
    f.fail("attention_bias", "is true: kiln's Qwen3 has no q/k/v/o projection biases");
  if (auto act = f.opt_str("hidden_act"); act && *act != "silu")
    f.fail("hidden_act", "is \"" + *act + "\" (kiln's MLP is SiLU-gated: \"silu\")");
}

constexpr const char* kQwen3VlMoe = "Qwen3VLMoeForConditionalGeneration";

ModelArch arch_from_name(const Fields& top, const std::string& name, std::string* weight_prefix) {
  if (name == "Qwen3ForCausalLM") {
    *weight_prefix = "model.";
    return ModelArch::qwen3;
  }
  if (name == "Qwen3Model") {  // Qwen3-Embedding as saved by sentence-transformers: no "model." prefix
    *weight_prefix = "";
    return ModelArch::qwen3_embedding;
  }
  if (name == "Qwen3VLForConditionalGeneration") {
    *weight_prefix = "model.language_model.";
    return ModelArch::qwen3_vl_text;
  }
  if (name == "Qwen3MoeForCausalLM") {
    *weight_prefix = "model.";
    return ModelArch::qwen3_moe;
  }
  if (name == kQwen3VlMoe) {  // Qwen3-VL's layout, with Qwen3-MoE's sparse MLP in the text decoder
    *weight_prefix = "model.language_model.";
    return ModelArch::qwen3_vl_text;
  }
  top.fail("architectures", "names \"" + name +
                                "\", which kiln does not support (Qwen3ForCausalLM, Qwen3Model, "
                                "Qwen3VLForConditionalGeneration, Qwen3MoeForCausalLM, "
                                "Qwen3VLMoeForConditionalGeneration)");
}

// Qwen3-VL's vision_config (defaults: transformers' Qwen3VLVisionConfig) and the top-level token ids.
void parse_vision(const Fields& top, ModelConfig& c) {
  VisionConfig& v = c.vision;
  auto tok = [&](const char* key, int64_t& out) {
    if (auto t = top.opt_int(key)) {
      if (*t < 0) top.fail(key, "must be a token id, got " + std::to_string(*t));
      out = *t;
    }
  };
  const json* vc = top.find("vision_config");
  if (!vc) return;  // the text decoder alone (has_vision stays false: images are refused)
  if (!vc->is_object()) top.fail("vision_config", "must be an object, got " + vc->dump());
  const Fields f(*vc, top.source(), "vision_config.");
  auto size = [&](const char* key, int64_t& out) {
    if (f.opt_int(key)) out = f.positive(key);
  };
  size("depth", v.depth);
  size("hidden_size", v.hidden_size);
  size("intermediate_size", v.intermediate_size);
  size("num_heads", v.num_heads);
  size("in_channels", v.in_channels);
  size("patch_size", v.patch_size);
  size("spatial_merge_size", v.spatial_merge_size);
  size("temporal_patch_size", v.temporal_patch_size);
  size("out_hidden_size", v.out_hidden_size);
  size("num_position_embeddings", v.num_position_embeddings);
  if (auto a = f.opt_str("hidden_act")) v.hidden_act = *a;
  if (v.hidden_act != "gelu_pytorch_tanh" && v.hidden_act != "gelu")
    f.fail("hidden_act", "is \"" + v.hidden_act + "\" (kiln's vision MLP runs gelu_pytorch_tanh or gelu)");
  if (v.hidden_size % v.num_heads != 0 || v.head_dim() % 4 != 0)
    f.fail("num_heads",
           "must divide hidden_size into heads whose size is a multiple of 4 (2-D rotary halves)");
  const int64_t side = v.grid_side();
  if (side * side != v.num_position_embeddings)
    f.fail("num_position_embeddings",
           "must be a square number, got " + std::to_string(v.num_position_embeddings));
  if (v.out_hidden_size != c.hidden_size)
    f.fail("out_hidden_size", "(" + std::to_string(v.out_hidden_size) +
                                  ") must equal text_config.hidden_size (" + std::to_string(c.hidden_size) +
                                  ")");
  if (f.find("deepstack_visual_indexes")) {
    const auto idx = f.opt_int_list("deepstack_visual_indexes");
    v.deepstack_visual_indexes = *idx;
  }
  for (size_t i = 0; i < v.deepstack_visual_indexes.size(); ++i) {
    const int64_t d = v.deepstack_visual_indexes[i];
    if (d < 0 || d >= v.depth || (i > 0 && d <= v.deepstack_visual_indexes[i - 1]))
      f.fail("deepstack_visual_indexes", "must be ascending block indexes in [0, depth)");
  }
  if (int64_t(v.deepstack_visual_indexes.size()) > c.num_layers)
    f.fail("deepstack_visual_indexes", "has more entries than the decoder has layers");
  tok("image_token_id", v.image_token_id);
  tok("video_token_id", v.video_token_id);
  tok("vision_start_token_id", v.vision_start_token_id);
  tok("vision_end_token_id", v.vision_end_token_id);
  // A checkpoint whose image tokens lie outside its vocabulary (test fixtures that keep transformers' default
  // ids with a tiny vocabulary) cannot take images: its text decoder alone is served.
  for (int64_t id : {v.image_token_id, v.vision_start_token_id, v.vision_end_token_id})
    if (id >= c.vocab_size) return;
  c.has_vision = true;
}

// Qwen3MoeConfig's sparse-MLP fields (transformers' defaults where optional). transformers 5 maps
// num_experts to num_local_experts, so either spelling is read.
void parse_moe(const Fields& f, ModelConfig& c) {
  MoeConfig& m = c.moe;
  const bool plain = f.find("num_experts") != nullptr, local = f.find("num_local_experts") != nullptr;
  if (!plain && !local) f.fail("num_experts", "is missing (a Qwen3-MoE config names its expert count)");
  m.num_experts = f.positive(plain ? "num_experts" : "num_local_experts");
  if (plain && local && f.positive("num_local_experts") != m.num_experts)
    f.fail("num_local_experts", "(" + std::to_string(f.positive("num_local_experts")) +
                                    ") disagrees with num_experts (" + std::to_string(m.num_experts) + ")");
  m.num_experts_per_tok = f.positive("num_experts_per_tok");
  if (m.num_experts_per_tok > m.num_experts)
    f.fail("num_experts_per_tok", "(" + std::to_string(m.num_experts_per_tok) + ") exceeds num_experts (" +
                                      std::to_string(m.num_experts) + ")");
  m.moe_intermediate_size = f.positive("moe_intermediate_size");
  if (auto step = f.opt_int("decoder_sparse_step")) {
    if (*step < 1) f.fail("decoder_sparse_step", "must be >= 1, got " + std::to_string(*step));
    m.decoder_sparse_step = *step;
  }
  if (const json* only = f.find("mlp_only_layers")) {
    if (!only->is_array()) f.fail("mlp_only_layers", "must be a list of layer indexes, got " + only->dump());
    for (const json& e : *only) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= c.num_layers)
        f.fail("mlp_only_layers", "holds " + e.dump() + ", not a layer index in [0, num_hidden_layers = " +
                                      std::to_string(c.num_layers) + ")");
      m.mlp_only_layers.push_back(e.get<int64_t>());
    }
  }
  if (auto n = f.opt_bool("norm_topk_prob")) m.norm_topk_prob = *n;
  if (auto s = f.opt_int("shared_expert_intermediate_size"); s && *s > 0)
    f.fail("shared_expert_intermediate_size",
           "is " + std::to_string(*s) + ": Qwen3-MoE has no shared expert");
}

// quantization_config: the one block-FP8 scheme kiln runs (kiln/config.h QuantConfig), or a refusal naming
// what the checkpoint asks for.
void parse_quantization(const Fields& top, const Fields& text, QuantConfig& q) {
  const Fields* owner = text.find("quantization_config") ? &text : &top;
  const json* qc = owner->find("quantization_config");
  if (!qc) return;
  if (!qc->is_object()) owner->fail("quantization_config", "must be an object, got " + qc->dump());
  const Fields f(*qc, owner->source(), owner->path("quantization_config") + ".");
  const std::optional<std::string> method = f.opt_str("quant_method");
  if (!method) f.fail("quant_method", "is missing");
  if (*method != "fp8")
    f.fail("quant_method", "is \"" + *method +
                               "\": kiln runs bf16 checkpoints and block-FP8 ones (quant_method \"fp8\", "
                               "e4m3, 128x128 blocks, as Qwen's -FP8 releases ship them); not awq, gptq, "
                               "compressed-tensors, bitsandbytes or other schemes");
  if (auto fmt = f.opt_str("fmt"); fmt && *fmt != "e4m3")
    f.fail("fmt", "is \"" + *fmt + "\" (kiln's FP8 weights are e4m3)");
  if (auto act = f.opt_str("activation_scheme"); act && *act != "dynamic")
    f.fail("activation_scheme", "is \"" + *act +
                                    "\": kiln quantizes activations dynamically (per token and 128-group); "
                                    "static activation scales are not supported");
  if (const json* b = f.find("weight_block_size")) {
    if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() || !(*b)[1].is_number_integer() ||
        (*b)[0].get<int64_t>() != 128 || (*b)[1].get<int64_t>() != 128)
      f.fail("weight_block_size", "is " + b->dump() + " (kiln's block-FP8 weights use [128, 128] blocks)");
  } else {
    f.fail("weight_block_size",
           "is missing: per-tensor FP8 scales are not supported (kiln runs [128, 128] "
           "blocks)");
  }
  if (const json* m = f.find("modules_to_not_convert")) {
    if (!m->is_array()) f.fail("modules_to_not_convert", "must be a list of strings, got " + m->dump());
    for (const json& e : *m) {
      if (!e.is_string()) f.fail("modules_to_not_convert", "must be a list of strings, got " + m->dump());
      q.modules_to_not_convert.push_back(e.get<std::string>());
    }
  }
  q.method = "fp8";
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t l) const {
  if (moe.num_experts <= 0 || (l + 1) % moe.decoder_sparse_step != 0) return false;
  for (int64_t d : moe.mlp_only_layers)
    if (d == l) return false;
  return true;
}

bool ModelConfig::has_moe_layers() const {
  for (int64_t l = 0; l < num_layers; ++l)
    if (is_moe_layer(l)) return true;
  return false;
}

std::string QuantConfig::describe() const {
  if (!fp8()) return "none";
  std::string s = online ? "fp8 (online from bf16: e4m3, 128x128 blocks, dynamic per-token-group activations)"
                         : "fp8 (checkpoint: e4m3, 128x128 blocks, dynamic per-token-group activations)";
  if (!modules_to_not_convert.empty()) {
    s += "; kept bf16:";
    for (const std::string& m : modules_to_not_convert) s += " " + m;
  }
  return s;
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source_name) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    KILN_FAIL(source_name, ": not valid JSON: ", e.what());
  }
  if (!root.is_object()) KILN_FAIL(source_name, ": must be a JSON object");
  const Fields top(root, source_name, "");

  ModelConfig c;
  if (const json* a = top.find("architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      top.fail("architectures", "must be a non-empty list of strings, got " + a->dump());
    c.architecture = (*a)[0].get<std::string>();
  } else if (auto mt = top.opt_str("model_type")) {
    if (*mt == "qwen3")
      c.architecture = "Qwen3ForCausalLM";
    else if (*mt == "qwen3_vl")
      c.architecture = "Qwen3VLForConditionalGeneration";
    else if (*mt == "qwen3_moe")
      c.architecture = "Qwen3MoeForCausalLM";
    else if (*mt == "qwen3_vl_moe")
      c.architecture = kQwen3VlMoe;
    else
      top.fail("model_type", "is \"" + *mt + "\" and 'architectures' is missing: not a supported model");
  } else {
    top.fail("architectures", "is missing (and so is model_type)");
  }
  c.arch = arch_from_name(top, c.architecture, &c.weight_prefix);
  if (c.arch == ModelArch::qwen3_embedding) c.embedding_source = "architectures";

  // The decoder's fields: Qwen3-VL nests them under text_config; some (dtype, tie, eos) may sit at the top.
  const json* text = &root;
  if (c.arch == ModelArch::qwen3_vl_text) {
    text = top.find("text_config");
    if (!text || !text->is_object()) top.fail("text_config", "is missing or not an object");
  }
  const Fields f(*text, source_name, c.arch == ModelArch::qwen3_vl_text ? "text_config." : "");

  c.vocab_size = f.positive_at_most("vocab_size", kMaxVocabSize);
  c.hidden_size = f.positive("hidden_size");
  c.intermediate_size = f.positive("intermediate_size");
  c.num_layers = f.positive("num_hidden_layers");
  c.num_heads = f.positive("num_attention_heads");
  c.num_kv_heads = f.opt_int("num_key_value_heads") ? f.positive("num_key_value_heads") : c.num_heads;
  if (c.num_heads % c.num_kv_heads != 0)
    f.fail("num_attention_heads", "(" + std::to_string(c.num_heads) +
                                      ") must be a multiple of num_key_value_heads (" +
                                      std::to_string(c.num_kv_heads) + ")");
  if (f.opt_int("head_dim")) {
    c.head_dim = f.positive("head_dim");
  } else {
    if (c.hidden_size % c.num_heads != 0)
      f.fail("head_dim", "is missing and hidden_size (" + std::to_string(c.hidden_size) +
                             ") is not a multiple of num_attention_heads (" + std::to_string(c.num_heads) +
                             ")");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (auto e = f.opt_num("rms_norm_eps")) c.rms_norm_eps = *e;
  if (!(c.rms_norm_eps > 0)) f.fail("rms_norm_eps", "must be positive");
  if (f.opt_int("max_position_embeddings"))
    c.max_position_embeddings = f.positive_at_most("max_position_embeddings", kMaxContextTokens);

  check_layer_layout(f, c);

  parse_rope(f, c);
  {
    const RopeScaling& s = c.rope_scaling;  // the context max_context() derives from the scaling
    const double ctx = s.kind == RopeScalingKind::yarn     ? std::max(double(c.max_position_embeddings),
                                                                      double(s.original_max_position) * s.factor)
                       : s.kind == RopeScalingKind::linear ? double(c.max_position_embeddings) * s.factor
                                                           : double(c.max_position_embeddings);
    if (ctx > double(kMaxContextTokens))
      f.fail(f.find("rope_parameters") ? "rope_parameters.factor" : "rope_scaling.factor",
             "gives a context of " + std::to_string(int64_t(std::min(ctx, 9e18))) +
                 " tokens, past kiln's limit of " + std::to_string(kMaxContextTokens));
  }
  const int64_t rot = c.rotary_dim();
  if (rot <= 0 || rot % 2 != 0 || rot > c.head_dim)
    f.fail("partial_rotary_factor",
           "gives rotary_dim " + std::to_string(rot) + ", which must be even and in (0, head_dim]");
  if (!c.mrope_section.empty()) {
    int64_t sum = 0;
    for (int s : c.mrope_section) sum += s;
    if (sum != rot / 2)
      f.fail(f.find("rope_parameters") ? "rope_parameters.mrope_section" : "rope_scaling.mrope_section",
             "sums to " + std::to_string(sum) + ", but rotary_dim / 2 is " + std::to_string(rot / 2));
  }

  // Fields that Qwen3-VL may keep at the top level: prefer the text section, then the top.
  auto either = [&](auto getter) {
    auto v = getter(f);
    if (!v && text != &root) v = getter(top);
    return v;
  };
  if (auto t = either([](const Fields& x) { return x.opt_bool("tie_word_embeddings"); }))
    c.tie_word_embeddings = *t;
  {
    const Fields* df = f.find("dtype") || f.find("torch_dtype") ? &f : &top;
    const char* key = df->find("dtype") ? "dtype" : "torch_dtype";
    if (auto d = df->opt_str(key)) c.dtype = parse_dtype(*df, key, *d);
  }
  if (auto e = either([](const Fields& x) { return x.opt_int_list("eos_token_id"); })) c.eos_token_ids = *e;
  if (auto b = either([](const Fields& x) { return x.opt_int("bos_token_id"); })) c.bos_token_id = *b;
  for (int64_t id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      f.fail("eos_token_id", "holds " + std::to_string(id) + ", outside [0, vocab_size)");
  if (c.arch == ModelArch::qwen3_vl_text) parse_vision(top, c);
  if (c.arch == ModelArch::qwen3_moe) parse_moe(f, c);
  if (c.architecture == kQwen3VlMoe) {
    parse_moe(f, c);
    // transformers' Qwen3VLMoeTextTopKRouter renormalizes the chosen experts' probabilities whatever the
    // config says (its text config has no norm_topk_prob field).
    c.moe.norm_topk_prob = true;
  }
  parse_quantization(top, f, c.quant);
  return c;
}

int64_t VisionConfig::grid_side() const {
  int64_t s = int64_t(std::sqrt(double(num_position_embeddings)));
  while (s * s > num_position_embeddings) --s;
  while ((s + 1) * (s + 1) <= num_position_embeddings) ++s;
  return s;
}

int64_t ModelConfig::max_context() const {
  switch (rope_scaling.kind) {
    case RopeScalingKind::yarn:  // the scaled window, or the configured one where that is longer
      return std::max<int64_t>(max_position_embeddings,
                               int64_t(double(rope_scaling.original_max_position) * rope_scaling.factor));
    case RopeScalingKind::linear:
      return int64_t(double(max_position_embeddings) * rope_scaling.factor);
    default:
      return max_position_embeddings;
  }
}

ModelConfig load_model_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) KILN_FAIL(path, ": cannot open (is '", model_dir, "' a Hugging Face checkpoint directory?)");
  std::ostringstream ss;
  ss << in.rdbuf();
  ModelConfig c = parse_model_config(ss.str(), path);
  apply_sentence_transformers(model_dir, c);
  return c;
}

void adapt_weight_prefix(ModelConfig& cfg, const std::vector<std::string>& tensor_names) {
  auto has = [&](const std::string& n) {
    for (const auto& t : tensor_names)
      if (t == n) return true;
    return false;
  };
  if (has(cfg.weight_prefix + "embed_tokens.weight")) return;
  for (const char* p : {"model.", "", "model.language_model.", "language_model.model."}) {
    if (has(std::string(p) + "embed_tokens.weight")) {
      cfg.weight_prefix = p;
      return;
    }
  }
  KILN_FAIL("checkpoint has no '", cfg.weight_prefix,
            "embed_tokens.weight' (nor under another known prefix)");
}

}  // namespace kiln
