// Deterministic workloads: the same (seed, tag, index) always yields the same prompt, so sweeps can be
// repeated and the A/B windows send identical requests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/request.h"

namespace kiln::client {

struct TextPrompt {
  std::string text;
  int64_t input_tokens = -1;  // stated prompt length in tokens, -1 when the file does not say
};

// One prompt per line. A line starting with '{' is JSON: {"prompt": "...", "input_tokens": N?};
// any other non-empty line is the prompt text itself. Empty files and bad JSON are errors.
std::vector<TextPrompt> load_prompts(const std::string& path);

struct Workload {
  int64_t input_len = 1024;  // random prompts: token ids per prompt
  int64_t output_len = 128;
  uint64_t seed = 1;
  int32_t vocab_lo = 1000;  // random ids are drawn uniformly from [vocab_lo, vocab_hi)
  int32_t vocab_hi = 30000;
  std::vector<TextPrompt> texts;  // when non-empty, prompts come from here instead of random ids
};

// n requests for the stream `tag` (e.g. the concurrency level, or a warm-up stream). Prompt i depends
// only on (seed, tag, i).
std::vector<RequestSpec> make_requests(const Workload& w, uint64_t tag, size_t n);

uint64_t splitmix64(uint64_t x);

}  // namespace kiln::client
