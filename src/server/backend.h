// What the HTTP layer needs from the rest of kiln, as two narrow interfaces, so the server can be tested
// against a fake engine and tokenizer (tests/unit/test_server_http.cpp) and run against the real ones
// (backend_engine.cpp adapts kiln::Engine and kiln::Tokenizer).
//
// Threading: submit/abort/flush_cache/stats are called from HTTP worker threads concurrently; the
// on_event callback runs on the engine thread and must not block (the server only queues the event).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace kiln::server {

class EngineApi {
 public:
  virtual ~EngineApi() = default;
  // Throws kiln::Error (bad input -> 400) or kiln::EngineBusyError (queue full / shutting down -> 503).
  virtual RequestId submit(Request req, std::function<void(const TokenEvent&)> on_event) = 0;
  virtual void abort(RequestId id) = 0;
  virtual void flush_cache() = 0;
  virtual EngineStats stats() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_context_len() const = 0;
  virtual bool is_embedding_model() const = 0;
  virtual int64_t hidden_size() const = 0;
  // The model's own EOS ids (config.json): where a structured output may end.
  virtual std::vector<int32_t> eos_token_ids() const { return {}; }
};

// Incremental detokenizer for one request: push() returns the text that became complete (never a split
// UTF-8 character); flush() returns what is left at the end.
class TextStream {
 public:
  virtual ~TextStream() = default;
  virtual std::string push(int32_t id) = 0;
  virtual std::string flush() = 0;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // Plain text to ids; no chat template. Throws kiln::Error on invalid UTF-8.
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // Text input of /v1/embeddings: as encode(), plus the tokenizer's post-processor tokens
  // (add_special_tokens, as sentence-transformers encodes; Qwen3-Embedding's appends the <|endoftext|> it
  // pools).
  virtual std::vector<int32_t> encode_embedding_input(const std::string& text) const { return encode(text); }
  // ids to text, special tokens skipped.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The raw bytes of one token (may be part of a UTF-8 character): used for logprobs' "bytes".
  virtual std::string token_bytes(int32_t id) const = 0;
  // A special (control) token: never part of a structured output's text (the grammar engine's vocabulary).
  virtual bool is_special(int32_t /*id*/) const { return false; }
  virtual std::unique_ptr<TextStream> stream() const = 0;
  // The chat template applied to an OpenAI chat request (messages, tools, chat_template_kwargs such as
  // enable_thinking), ending with the assistant generation prompt. Throws kiln::Error on bad messages.
  virtual std::string render_chat(const nlohmann::json& request) const = 0;
  // Whether the chat template writes <think> blocks (Qwen3's does): `--reasoning-parser auto` is on then.
  virtual bool chat_template_thinks() const { return false; }
};

}  // namespace kiln::server
