// The processor files of `kiln demo-model --arch vl`: what a Qwen3-VL checkpoint ships beside its weights
// for image inputs (preprocessor_config.json; the chat template of the Qwen3-VL form belongs here too).
#pragma once

#include <filesystem>

#include "kiln/config.h"

namespace kiln::cli {

// Writes DIR/preprocessor_config.json for cfg's vision tower (patch, temporal patch and merge sizes from
// cfg.vision; Qwen3-VL's normalization and pixel limits) and DIR/chat_template.json (Qwen3-VL-4B-Instruct's
// own template, src/vision/qwen3_vl_assets.h).
void write_demo_vl_files(const std::filesystem::path& dir, const ModelConfig& cfg);

}  // namespace kiln::cli
