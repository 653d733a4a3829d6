// A checkpoint's generation_config.json as request defaults (vLLM's `--generation-config auto`): its
// eos_token_id list ends generation (Qwen3: <|im_end|> and <|endoftext|>, where config.json names only the
// first), and its temperature / top_p / top_k / min_p / repetition_penalty apply to requests that do not
// set them. do_sample is ignored, as vLLM ignores it. Out-of-range values (repetition_penalty outside
// (0, 2], ...) are not applied and are named in `warnings`; a missing file gives no defaults.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace kiln::server {

struct GenerationDefaults {
  SamplingParams sampling;            // the defaults; fields the file does not set keep SamplingParams' own
  std::vector<int32_t> eos_ids;       // end generation unless ignore_eos (added to each request's stop ids)
  std::vector<std::string> applied;   // "temperature=0.6", ... for the start-up log
  std::vector<std::string> warnings;  // what was in the file and is not applied, and why
};

// Reads model_dir/generation_config.json. Throws kiln::Error when the file exists but is not a JSON object.
GenerationDefaults load_generation_config(const std::string& model_dir, int64_t vocab_size);
// The same from the file's text (tests).
GenerationDefaults parse_generation_config(const std::string& text, int64_t vocab_size);

}  // namespace kiln::server
