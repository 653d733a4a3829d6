#include "cli/demo_vl_files.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/error.h"
#include "vision/qwen3_vl_assets.h"

namespace kiln::cli {

void write_demo_vl_files(const std::filesystem::path& dir, const ModelConfig& cfg) {
  KILN_CHECK(cfg.has_vision, "write_demo_vl_files: the config has no vision tower");
  const VisionConfig& v = cfg.vision;
  // Qwen3-VL-4B-Instruct's preprocessor_config.json, with the sizes of this tower.
  const nlohmann::json pre = {
      {"image_mean", {0.5, 0.5, 0.5}},
      {"image_processor_type", "Qwen2VLImageProcessorFast"},
      {"image_std", {0.5, 0.5, 0.5}},
      {"merge_size", v.spatial_merge_size},
      {"patch_size", v.patch_size},
      {"processor_class", "Qwen3VLProcessor"},
      {"size", {{"longest_edge", 16777216}, {"shortest_edge", 65536}}},
      {"temporal_patch_size", v.temporal_patch_size},
  };
  const std::filesystem::path p = dir / "preprocessor_config.json";
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  KILN_CHECK(f.good(), "cannot write ", p.string());
  f << pre.dump(2) << "\n";
  f.close();
  KILN_CHECK(f.good(), "write to ", p.string(), " failed");
  // The Qwen3-VL-4B-Instruct chat template (image parts -> <|vision_start|><|image_pad|><|vision_end|>), as a
  // VL checkpoint ships it: chat_template.json, which transformers prefers to tokenizer_config.json's.
  const std::filesystem::path t = dir / "chat_template.json";
  std::ofstream ft(t, std::ios::binary | std::ios::trunc);
  KILN_CHECK(ft.good(), "cannot write ", t.string());
  ft << nlohmann::json{{"chat_template", std::string(kiln::vision::qwen3_vl_chat_template())}}.dump(2)
     << "\n";
  ft.close();
  KILN_CHECK(ft.good(), "write to ", t.string(), " failed");
}

}  // namespace kiln::cli
