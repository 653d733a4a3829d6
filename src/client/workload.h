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
  // An image for every request (random-id prompts, /generate): base64 of the file, and the placeholder token
  // ids appended to each prompt (vision start, image pad, vision end: Qwen3-VL's by default). Appended, so
  // the random ids before it keep requests from sharing prefix-cache pages; the server reports the prompt
  // length with the image's tokens, which the client does not know (the count is then not checked).
  std::string image_b64;
  std::vector<int32_t> image_tokens = {151652, 151655, 151653};
};

// Standard base64 with padding.
std::string base64_encode(const std::string& bytes);

// n requests for the stream `tag` (e.g. the concurrency level, or a warm-up stream). Prompt i depends
// only on (seed, tag, i).
std::vector<RequestSpec> make_requests(const Workload& w, uint64_t tag, size_t n);

uint64_t splitmix64(uint64_t x);

}  // namespace kiln::client
