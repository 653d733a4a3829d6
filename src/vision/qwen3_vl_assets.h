// The Qwen3-VL-4B-Instruct checkpoint's own chat template (its chat_template.json, identical to the one in
// its tokenizer_config.json) and its preprocessor_config.json, embedded at build time from the files beside
// this header (qwen3_vl_chat_template.jinja, qwen3_vl_preprocessor_config.json; where they come from:
// README.md). `kiln demo-model --arch vl` writes them into the checkpoint it makes; tests render the
// template.
#pragma once

#include <string_view>

namespace kiln::vision {

std::string_view qwen3_vl_chat_template();
std::string_view qwen3_vl_preprocessor_config_json();

}  // namespace kiln::vision
