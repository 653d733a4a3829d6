// /v1/responses, OpenAI's Responses API, over the chat route's machinery: a request is rewritten into a chat
// completions request (parse_responses_request), so the chat template, sampling, reasoning and tool-call
// parsing are the chat route's; its output is shaped as Response output items, whole or as the streamed
// events (ResponseOutputBuilder).
//
// Request fields: model, input (a string, or items: messages with string or input_text / output_text /
// input_image parts, function_call and function_call_output items; reasoning items are accepted and
// dropped, as Qwen3's template drops past reasoning), instructions (a system message first; not carried
// over by previous_response_id, as OpenAI), tools (the flat {"type": "function", "name", "description",
// "parameters", "strict"} shape), tool_choice, parallel_tool_calls, max_output_tokens, temperature, top_p,
// reasoning.effort (as the chat route's reasoning_effort), text.format {"type": "text"}, stream, store
// (default true), previous_response_id, metadata (echoed), user (echoed). Refused with a 400 naming them:
// other tool types, text.format other than text, include, background true, truncation "auto".
//
// Output items: a "reasoning" item (Qwen3's <think> text as one summary_text part), a "message" item (one
// output_text part), one "function_call" item per tool call, in the order the model wrote them.
// status "completed", or "incomplete" with incomplete_details.reason "max_output_tokens" at the length limit.
//
// Stored responses (store true): the response object and the conversation it ends (its input messages and
// the assistant turn) are kept in memory, at most ResponseStore::capacity of them; past it the oldest is
// dropped (FIFO), and a previous_response_id naming a dropped or unknown id is a 404.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/generation.h"
#include "server/output_parser.h"
#include "server/protocol.h"

namespace kiln::server {

struct StoredResponse {
  nlohmann::json response;      // the Response object as returned
  nlohmann::json conversation;  // chat messages: the input (without instructions) and the assistant turn
};

class ResponseStore {
 public:
  explicit ResponseStore(size_t capacity) : capacity_(capacity) {}
  void put(const std::string& id, StoredResponse r);
  std::optional<StoredResponse> get(const std::string& id) const;
  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, StoredResponse> by_id_;
  std::deque<std::string> order_;  // oldest first
};

struct ResponsesSpec {
  GenSpec gen;                  // the chat route's spec of the rewritten request
  nlohmann::json echo;          // request fields the Response object echoes (instructions, tools, ...)
  nlohmann::json conversation;  // chat messages without instructions: what a later turn continues
  bool store = true;
};

ResponsesSpec parse_responses_request(const nlohmann::json& body, const ResponseStore& store,
                                      const TextCodec& codec, const ApiLimits& lim);

// Builds the output items from the parser's deltas; when streaming, also the SSE events that announce them.
class ResponseOutputBuilder {
 public:
  ResponseOutputBuilder(std::string response_id, bool stream)
      : resp_id_(std::move(response_id)), stream_(stream) {}

  // Appends the events for one parsed delta to `out` (nothing when not streaming).
  void feed(const ParsedDelta& d, std::string& out);
  // Closes the open item.
  void close(std::string& out);
  // One event frame: "event: TYPE\ndata: {...}\n\n" with the next sequence_number.
  void event(std::string& out, const char* type, nlohmann::json data);

  const nlohmann::json& items() const { return items_; }
  // The assistant turn for the stored conversation (content and tool_calls in chat form).
  nlohmann::json assistant_message() const;

 private:
  enum class Open { none, reasoning, message };
  void open(Open kind, std::string& out);
  std::string item_id(const char* prefix);

  std::string resp_id_;
  bool stream_;
  Open open_ = Open::none;
  nlohmann::json items_ = nlohmann::json::array();
  std::string text_;  // the open item's text so far
  int64_t seq_ = 0;
  int next_item_ = 0;
};

// The Response object: status from the tracker's finish reason, usage from its counts.
nlohmann::json response_object(const std::string& id, int64_t created, const ResponsesSpec& spec,
                               const nlohmann::json& output, const OutputTracker* done);

}  // namespace kiln::server
