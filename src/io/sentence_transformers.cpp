// sentence-transformers checkpoints (modules.json: Transformer -> Pooling -> Normalize) -> the embedding
// head in ModelConfig. Qwen3-Embedding ships this way with architectures ["Qwen3ForCausalLM"].
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/config.h"
#include "kiln/error.h"

namespace kiln {

namespace {

using json = nlohmann::json;

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) KILN_FAIL(p.string(), ": cannot open");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    KILN_FAIL(p.string(), ": not valid JSON: ", e.what());
  }
}

// "sentence_transformers.models.Pooling" -> "Pooling" (older and newer packages differ in the prefix).
std::string module_kind(const std::string& type) {
  const size_t dot = type.rfind('.');
  return dot == std::string::npos ? type : type.substr(dot + 1);
}

EmbeddingPooling read_pooling(const std::filesystem::path& file, const ModelConfig& c) {
  const json p = read_json(file);
  if (!p.is_object()) KILN_FAIL(file.string(), ": must be a JSON object");
  auto on = [&](const char* key) {
    const auto it = p.find(key);
    if (it == p.end() || it->is_null()) return false;
    if (!it->is_boolean()) KILN_FAIL(file.string(), ": field '", key, "' must be true or false");
    return it->get<bool>();
  };
  // sentence-transformers < 6 (the hub's Qwen3-Embedding) writes word_embedding_dimension and one boolean per
  // mode; 6.x writes embedding_dimension and a pooling_mode string.
  for (const char* dim_key : {"word_embedding_dimension", "embedding_dimension"}) {
    if (auto it = p.find(dim_key); it != p.end() && !it->is_null()) {
      if (!it->is_number_integer() || it->get<int64_t>() != c.hidden_size)
        KILN_FAIL(file.string(), ": field '", dim_key, "' is ", it->dump(), ", but hidden_size is ",
                  c.hidden_size);
    }
  }
  if (auto it = p.find("pooling_mode"); it != p.end() && !it->is_null()) {
    const std::string mode = it->is_string() ? it->get<std::string>() : it->dump();
    if (mode == "lasttoken") return EmbeddingPooling::last_token;
    if (mode == "mean") return EmbeddingPooling::mean;
    if (mode == "cls") return EmbeddingPooling::cls;
    KILN_FAIL(file.string(), ": field 'pooling_mode' is '", mode,
              "': kiln pools by lasttoken, mean or cls only");
  }
  for (const char* unsupported :
       {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens"})
    if (on(unsupported))
      KILN_FAIL(file.string(), ": field '", unsupported,
                "' is true: kiln pools by lasttoken, mean or cls only");
  const bool last = on("pooling_mode_lasttoken"), mean = on("pooling_mode_mean_tokens"),
             cls = on("pooling_mode_cls_token");
  if (int(last) + int(mean) + int(cls) != 1)
    KILN_FAIL(
        file.string(),
        ": exactly one of pooling_mode_lasttoken, pooling_mode_mean_tokens, pooling_mode_cls_token must be "
        "true (sentence-transformers concatenates several; kiln does not)");
  return last ? EmbeddingPooling::last_token : mean ? EmbeddingPooling::mean : EmbeddingPooling::cls;
}

}  // namespace

void apply_sentence_transformers(const std::string& model_dir, ModelConfig& c) {
  namespace fs = std::filesystem;
  const fs::path file = fs::path(model_dir) / "modules.json";
  if (!fs::exists(file)) return;
  const json mods = read_json(file);
  if (!mods.is_array() || mods.empty()) KILN_FAIL(file.string(), ": must be a non-empty list of modules");
  if (c.arch == ModelArch::qwen3_vl_text)
    KILN_FAIL(file.string(), ": a Qwen3-VL checkpoint as a sentence-transformers model is not supported");
  bool pooled = false, normalize = false;
  EmbeddingPooling pooling = EmbeddingPooling::last_token;
  for (size_t i = 0; i < mods.size(); ++i) {
    const json& m = mods[i];
    const std::string where = file.string() + ": module " + std::to_string(i);
    if (!m.is_object() || !m.contains("type") || !m.at("type").is_string())
      KILN_FAIL(where, " must be an object with a string 'type'");
    const std::string kind = module_kind(m.at("type").get<std::string>());
    const std::string path = m.value("path", "");
    if (kind == "Transformer") {
      if (i != 0 || !path.empty()) KILN_FAIL(where, ": the Transformer module must come first, at path \"\"");
    } else if (kind == "Pooling") {
      if (i == 0 || pooled) KILN_FAIL(where, ": one Pooling module, after the Transformer");
      pooling = read_pooling(fs::path(model_dir) / path / "config.json", c);
      pooled = true;
    } else if (kind == "Normalize") {
      if (!pooled) KILN_FAIL(where, ": Normalize before Pooling is not supported");
      normalize = true;
    } else {
      KILN_FAIL(where, " is '", m.at("type").get<std::string>(),
                "': kiln supports Transformer -> Pooling -> Normalize only");
    }
  }
  if (!pooled) KILN_FAIL(file.string(), ": no Pooling module");
  c.arch = ModelArch::qwen3_embedding;
  c.pooling = pooling;
  c.normalize_embeddings = normalize;
  c.embedding_source = "modules.json";
}

void force_embedding(ModelConfig& c) {
  KILN_CHECK(c.arch != ModelArch::qwen3_vl_text, "--is-embedding: ", c.architecture,
             " checkpoints cannot be served as embedding models");
  if (c.arch == ModelArch::qwen3_embedding) return;
  c.arch = ModelArch::qwen3_embedding;
  c.embedding_source = "--is-embedding";
}

}  // namespace kiln
