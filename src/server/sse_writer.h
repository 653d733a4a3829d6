// The streaming hot path's JSON, written straight into one buffer: the SSE frames of the fixed chunk shapes
// (chat.completion.chunk, text_completion, /generate's cumulative object), byte-identical to
// sse_frame(<the nlohmann object responses.h builds>) -- the same key order (nlohmann's objects are sorted
// maps), the same escapes (control characters as \u00xx, non-ASCII as is, invalid UTF-8 as U+FFFD exactly
// where nlohmann's replace handler puts it), the same numbers. Parts that are rare or nested (logprobs,
// tool calls, usage objects) come in as JSON text the caller dumped with dump_json.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/frame.h"
#include "server/responses.h"

namespace kiln::server::sse {

// A JSON string literal (quotes included) for `s`, as dump_json writes it.
void append_string(std::string& out, std::string_view s);
void append_int(std::string& out, int64_t v);
// As nlohmann writes a double: the shortest round-trip digits (its Grisu2), "null" when not finite.
void append_double(std::string& out, double v);

// A growing string's JSON text, kept so each frame appends only what is new. Holds the escape of the
// longest prefix that ends on a UTF-8 character boundary (so the tail is escaped the same, whole or later).
class StringCache {
 public:
  // The string literal of `s`; `s` must extend the string passed last time.
  void append_literal(Frame& out, const std::string& s);

 private:
  std::string escaped_;  // the escape of s[0, done_), without quotes
  size_t done_ = 0;
};

// The same for a growing list of ids: "1,2,3" without brackets.
class IdsCache {
 public:
  void append_array(Frame& out, const std::vector<int32_t>& ids);

 private:
  std::string joined_;
  size_t done_ = 0;
};

// What one chunk carries besides its context; every *_json is JSON text ("null" where absent).
struct ChunkParts {
  std::string_view body_json;           // chat: the delta object; completion: the text literal
  std::string_view finish_reason_json;  // "null" or a string literal
  std::string_view logprobs_json;
  std::string_view usage_json;  // empty: no "usage" key
};

// "data: {chat.completion.chunk}\n\n" == sse_frame(chat_chunk(...)) (+ "usage" when given).
void append_chat_chunk(std::string& out, const ResponseCtx& c, const ChunkParts& p);
// "data: {text_completion}\n\n" == sse_frame(completion_chunk(...)) (+ "usage" when given).
void append_completion_chunk(std::string& out, const ResponseCtx& c, const ChunkParts& p);
// A chat delta holding only content and/or reasoning text (chat_delta's shape for those).
void append_text_delta(std::string& out, const std::string& content, const std::string& reasoning);

// "data: {/generate object}\n\n" of a running request without logprobs (generate_response's shape then:
// finish_reason null, no hidden states), text and output_ids as views of the caches (sent from there).
void append_generate_running(Frame& out, const ResponseCtx& c, const OutputTracker& t, bool with_index,
                             double e2e_seconds, StringCache& text, IdsCache& ids);

}  // namespace kiln::server::sse
