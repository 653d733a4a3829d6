// The top-level fields each POST route reads (implements, or refuses with a 400 naming them), so that
// `kiln serve --log-level debug` can log the fields a request carried that kiln does not read: unknown
// fields stay accepted (clients send them), and this is where a user sees what was ignored. docs/SERVING.md
// lists the same fields with what kiln does with each.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kiln::server {

// The fields of `body` (a POST to `path`) that the route does not read, in the body's order; empty for a
// path without a list (GET routes, unknown paths) or a body that is not an object.
std::vector<std::string> unknown_request_fields(const std::string& path, const nlohmann::json& body);

// vLLM's extra sampling fields (OpenAI routes) that would change the output and that kiln does not implement:
// a 400 naming the field when set to anything but vLLM's default: use_beam_search (false), allowed_token_ids
// and bad_words (empty), skip_special_tokens (true), priority (0; vLLM too refuses it without priority
// scheduling).
void refuse_vllm_output_fields(const nlohmann::json& body);

// The debug line for them: "kiln server: debug: POST /v1/completions: fields not read by kiln: a, b", or ""
// when there are none or the body is not JSON.
std::string unknown_fields_log_line(const std::string& path, const std::string& body);

}  // namespace kiln::server
