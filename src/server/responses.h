// Response bodies in the shapes clients expect: OpenAI chat.completion(.chunk), text_completion,
// embeddings list, logprobs (chat: {"content": [{token, logprob, bytes, top_logprobs}]}; completions:
// {tokens, token_logprobs, top_logprobs, text_offset}), and SGLang /generate {text, output_ids, meta_info}.
// SSE frames are "data: <json>\n\n", ending with "data: [DONE]\n\n".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/backend.h"
#include "server/generation.h"
#include "server/protocol.h"

namespace kiln::server {

struct ResponseCtx {
  std::string id;       // "chatcmpl-...", "cmpl-...", or the /generate rid
  int64_t created = 0;  // unix seconds
  std::string model;
  int index = 0;  // the choice (n > 1: 0..n-1), in choices[].index and /generate's "index"
};

// JSON text; invalid UTF-8 (a model can emit any bytes) becomes U+FFFD instead of throwing.
std::string dump_json(const nlohmann::json& j);
// Invalid UTF-8 sequences replaced by U+FFFD, byte by byte (a token may be part of a character).
std::string valid_utf8(const std::string& s);
// Completions' text_offset counts characters (OpenAI, vLLM): the code points of a token's text, a partial
// UTF-8 character counting as the U+FFFD it is shown as.
size_t text_offset_length(const std::string& token_bytes);
inline std::string sse_frame(const nlohmann::json& j) {
  return "data: " + dump_json(j) + "\n\n";
}
inline const char* sse_done() {
  return "data: [DONE]\n\n";
}

nlohmann::json usage_json(const OutputTracker& t);
// n choices of each of one or more prompts, in prompt order (OpenAI's and vLLM's accounting): each prompt
// counted once (its first choice's count, cached tokens too), completion tokens summed over every choice.
nlohmann::json usage_json(const std::vector<const OutputTracker*>& choices, int n);
// One response body from the per-choice bodies of n choices: the first body, with every body's choices[]
// and the summed usage.
nlohmann::json merge_choices(const std::vector<nlohmann::json>& bodies, nlohmann::json usage);
// OpenAI finish_reason: "stop", "length", or kiln's "abort" (null while running).
nlohmann::json finish_reason_json(const OutputTracker& t);

nlohmann::json chat_logprobs(const std::vector<TokenOut>& toks, const TextCodec& codec);
nlohmann::json completion_logprobs(const std::vector<TokenOut>& toks, const TextCodec& codec,
                                   size_t text_offset);

nlohmann::json chat_chunk(const ResponseCtx& c, nlohmann::json delta, nlohmann::json finish_reason,
                          nlohmann::json logprobs);
nlohmann::json completion_chunk(const ResponseCtx& c, const std::string& text, nlohmann::json finish_reason,
                                nlohmann::json logprobs);
nlohmann::json usage_chunk(const ResponseCtx& c, const char* object, const OutputTracker& t);

// Chat deltas from the output parser: content, reasoning_content and tool_calls (OpenAI's streaming
// shape: {index, id, type: "function", function: {name, arguments}}), each only when present; a delta
// with none of them is {"content": ""}.
nlohmann::json chat_delta(const ParsedDelta& d);
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index);
// finish_reason_json, but "tool_calls" for a reply that stopped (not length/abort) after making calls.
nlohmann::json chat_finish_reason(const OutputTracker& t, int tool_calls);

// The message is parsed as spec.parse says: reasoning_content (when there was reasoning), tool_calls
// (content null when nothing else was said).
nlohmann::json chat_response(const ResponseCtx& c, const OutputTracker& t, const GenSpec& spec,
                             const TextCodec& codec);
nlohmann::json completion_response(const ResponseCtx& c, const OutputTracker& t, const GenSpec& spec,
                                   const TextCodec& codec);
nlohmann::json generate_response(const ResponseCtx& c, const OutputTracker& t, const GenSpec& spec,
                                 const TextCodec& codec, double e2e_seconds);

// data[i].embedding: floats, or base64 of little-endian float32 when asked.
nlohmann::json embeddings_response(const std::string& model, const std::vector<std::vector<float>>& vecs,
                                   bool base64, int64_t prompt_tokens);
// Truncates to `dims` (when 0 < dims < size) and L2-normalises again.
std::vector<float> shape_embedding(std::vector<float> v, int64_t dims);
std::string base64_floats(const std::vector<float>& v);

}  // namespace kiln::server
