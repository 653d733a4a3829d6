#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/tokenizer.h"
#include "server/images.h"

namespace kiln::server {

namespace {
std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

std::shared_ptr<const VisionSetup> load_vision_setup(const std::string& model_dir, const Tokenizer& tok,
                                                     const vision::ImageLimits& limits,
                                                     const ImageFetchOptions& fetch, std::string& note) {
  const std::filesystem::path dir(model_dir);
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(read_file(dir / "config.json"));
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL(model_dir, "/config.json is not JSON: ", e.what());
  }
  if (!cfg.is_object() || !cfg.contains("vision_config")) return nullptr;
  const auto pre = dir / "preprocessor_config.json";
  if (!std::filesystem::exists(pre)) {
    note = "config.json has a vision_config but there is no preprocessor_config.json: images are refused";
    return nullptr;
  }
  auto setup = std::make_shared<VisionSetup>();
  setup->processor = vision::parse_processor_config(read_file(pre));
  if (limits.max_resized_pixels > 0) {
    vision::ProcessorConfig& p = setup->processor;
    const int64_t least = std::max<int64_t>(p.min_pixels, int64_t(p.factor()) * p.factor());
    KILN_CHECK(limits.max_resized_pixels >= least, "--image-max-resized-pixels ", limits.max_resized_pixels,
               " is below the processor's minimum of ", least, " pixels");
    p.max_pixels = std::min(p.max_pixels, limits.max_resized_pixels);
  }
  setup->limits = limits;
  setup->fetch = fetch;
  auto id = [&](const char* token, const char* config_key) {
    const auto v = tok.token_id(token);
    KILN_CHECK(v.has_value(), model_dir, ": the tokenizer has no ", token, " token");
    if (cfg.contains(config_key) && cfg[config_key].is_number_integer())
      KILN_CHECK_EQ(*v, cfg[config_key].get<int32_t>(), token, " in the tokenizer vs config.json ",
                    config_key);
    return *v;
  };
  setup->tokens.vision_start = id("<|vision_start|>", "vision_start_token_id");
  setup->tokens.vision_end = id("<|vision_end|>", "vision_end_token_id");
  setup->tokens.image_pad = id("<|image_pad|>", "image_token_id");
  return setup;
}

}  // namespace kiln::server
