// Structured output in the server: the request fields that ask for a grammar, parsed into one
// GrammarRequest, and the service that compiles it against the model's vocabulary (a content cache and a
// compile pool with a time limit) before the request reaches the engine.
//
// Fields (docs/SERVING.md "Structured output"): OpenAI `response_format` {"type": "json_object"} or
// {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}; SGLang's `json_schema` (JSON text or
// an object), `regex`, `ebnf`; vLLM's `structured_outputs` {json | regex | choice | grammar | json_object}
// and `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`; on /generate the same names
// inside `sampling_params`; the Responses API's `text.format` (responses_api.cpp maps it onto
// response_format). A request gives at most one of them: two are a 400 naming both. Forced tool calls
// (`tool_choice` "required" or a named function, or `strict` tools under "auto") become a tool_calls
// grammar over Qwen3's <tool_call> blocks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kiln/grammar.h"
#include "server/backend.h"

namespace kiln::server {

struct GrammarRequest {
  grammar::GrammarKind kind = grammar::GrammarKind::any_json;
  std::string text;     // the schema (compact JSON), regex, EBNF, or tool-call spec
  bool strict = false;  // JSON Schema: additionalProperties defaults to false (OpenAI strict)
  std::string field;    // the request field it came from: errors name it
};

// Every structured-output field of `obj` (a chat or completions body, or /generate's sampling_params;
// response_format only where openai_body). nullopt: none asked for. Throws ApiError (400) naming the field.
// The fields parse_structured_output reads, copied out of a body as the server holds it.
nlohmann::ordered_json structured_output_fields(const nlohmann::json& obj);
// Takes ordered JSON so that a schema keeps the client's property order (see with_body_order).
std::optional<GrammarRequest> parse_structured_output(const nlohmann::ordered_json& obj, bool openai_body);

// The grammar a chat request's tools force: tool_choice "required" (one or more calls; exactly one with
// parallel_tool_calls false) or {"type": "function", "function": {"name"}} (exactly one call of it), or,
// under "auto", tools that all say "strict": true (free text, or text followed by well-formed calls).
// nullopt: the model chooses freely. `tools` is validated already (validate_tools).
std::optional<GrammarRequest> tool_call_grammar(const nlohmann::ordered_json* tools,
                                                const nlohmann::ordered_json* tool_choice,
                                                bool parallel_tool_calls);

// The request body as the server holds it (nlohmann::json) keeps object keys sorted, so a schema taken from
// it lists its properties alphabetically, and the grammar generates them in that order. This re-reads the raw
// body in its own order and returns g with the schema's text as the client wrote it (g itself when anything
// differs).
enum class BodyShape { openai, generate, responses };
GrammarRequest with_body_order(GrammarRequest g, const std::string& raw_body, BodyShape shape);

// A chat request's grammar: its structured-output field, or the one its forced tool calls make (both: 400
// naming both, unless the calls come from strict tools under "auto", which give way). Forced calls need the
// tool-call parser (tool_call_parser false: 400).
std::optional<GrammarRequest> chat_grammar(const nlohmann::json& body, const nlohmann::json* tools,
                                           bool tool_call_parser);

// The id of Qwen3's </think> when the tokenizer has it as one token, else -1: with reasoning on, the
// grammar applies from the token after it (the reasoning itself is free, as in SGLang).
int32_t think_end_token(const TextCodec& codec);

struct GrammarServiceOptions {
  bool lenient = false;            // --grammar-lenient: drop JSON Schema keywords the engine cannot enforce
  int compile_threads = 2;         // the compile pool
  int compile_timeout_ms = 10000;  // --grammar-compile-timeout-ms: a request waits at most this long
  size_t max_pending = 64;         // compiles queued or running; past it a request gets 503
  size_t cache_entries = 512;      // compiled grammars kept by content
};

// Compiles grammars against one vocabulary (built on first use from the codec: each id's bytes, special
// tokens excluded, EOS ids allowed where a grammar is complete). Thread-safe; compiles run on the pool's
// threads, never on the engine's.
class GrammarService {
 public:
  GrammarService(const TextCodec& codec, int64_t vocab_size, std::vector<int32_t> eos_ids,
                 GrammarServiceOptions opts);
  ~GrammarService();
  GrammarService(const GrammarService&) = delete;
  GrammarService& operator=(const GrammarService&) = delete;

  // The compiled grammar (from the cache, or compiled now). Throws ApiError: 400 naming g.field for an
  // unsupported keyword, a malformed grammar or a compile past the time limit; 503 when the pool is full.
  std::shared_ptr<const grammar::CompiledGrammar> compile(const GrammarRequest& g);
  size_t cached() const;

 private:
  void work();
  std::shared_ptr<const grammar::TokenVocab> vocab();

  const TextCodec& codec_;
  int64_t vocab_size_;
  std::vector<int32_t> eos_ids_;
  GrammarServiceOptions opts_;
  std::once_flag vocab_once_;
  std::shared_ptr<const grammar::TokenVocab> vocab_;
  std::unique_ptr<grammar::GrammarCache> cache_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  size_t pending_ = 0;  // queued or running
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kiln::server
