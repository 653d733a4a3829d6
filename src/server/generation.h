// One generation request as the HTTP thread sees it: the queue that carries engine events over from the
// engine thread, and the tracker that turns token ids into released text (incremental detokenization,
// stop strings held back and trimmed), logprob entries and the final accounting.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/backend.h"
#include "server/protocol.h"
#include "server/stop_matcher.h"

namespace kiln::server {

// Engine thread -> HTTP thread. push() takes a lock for a moment and never blocks otherwise.
class EventQueue {
 public:
  // When push() says the response's connection should be woken: `every` > 0 tokens queued since the last
  // wake (the first event with tokens wakes at once, so the time to the first token does not wait); 0:
  // only events without tokens, such as the finish. A finish or an event without tokens always wakes.
  explicit EventQueue(int every = 1) : every_(every) {}
  // Queues e; true when the connection is due a wake (see the constructor).
  bool push(const TokenEvent& e);
  // Replaces `out` with every queued event. The two sides swap buffers, so a steady stream allocates no
  // queue storage.
  void take(std::vector<TokenEvent>& out);

 private:
  std::mutex mu_;
  std::vector<TokenEvent> events_;
  const int every_;
  size_t unwoken_tokens_ = 0;  // queued since the last wake
  bool woke_with_tokens_ = false;
};

// One released (not hidden by a stop) generated token, for logprobs in any endpoint's shape.
struct TokenOut {
  int32_t id = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

struct Delta {
  std::string text;              // newly released text
  std::vector<int32_t> ids;      // tokens consumed by this event (up to a stop-string match)
  std::vector<TokenOut> tokens;  // with logprobs, when asked for
};

class OutputTracker {
 public:
  OutputTracker(const TextCodec& codec, const GenSpec& spec);

  Delta consume(const TokenEvent& e);

  bool finished() const { return finished_; }
  // A stop string ended the request here: the caller aborts the engine request (the engine reports it
  // as "abort"; the client sees "stop").
  bool stopped_by_string() const { return stopped_by_string_; }
  const std::string& finish_reason() const {
    return finish_reason_;
  }                                                           // "stop" | "length" | "abort" | "error"
  const nlohmann::json& matched() const { return matched_; }  // stop string / token id / null
  const std::string& error() const { return error_; }
  const std::string& text() const { return text_; }
  const std::vector<int32_t>& output_ids() const { return output_ids_; }
  const std::vector<TokenOut>& tokens() const { return tokens_; }
  const std::vector<float>& hidden() const { return hidden_; }
  // The engine's prompt logprobs and scores (runtime/engine.h), once they came.
  const std::vector<PromptTokenLogprob>& prompt_logprobs() const { return prompt_logprobs_; }
  const std::vector<float>& score_logprobs() const { return score_logprobs_; }
  int prompt_tokens() const { return prompt_tokens_; }
  int completion_tokens() const { return completion_tokens_; }
  int cached_tokens() const { return cached_tokens_; }
  const spec::SpecRequestStats& spec() const { return spec_; }  // the engine's last count (TokenEvent::spec)

 private:
  void finish_text(Delta& d);

  std::unique_ptr<TextStream> stream_;
  StopMatcher stop_;
  bool want_logprobs_;
  bool include_stop_;  // a matched stop string stays in the text (include_stop_str_in_output)
  int min_tokens_;     // stop strings are looked for from this token on (1-based)
  bool finished_ = false;
  bool stopped_by_string_ = false;
  std::string finish_reason_;
  nlohmann::json matched_;
  std::string error_;
  std::string text_;
  std::vector<int32_t> output_ids_;
  std::vector<TokenOut> tokens_;
  std::vector<float> hidden_;
  std::vector<PromptTokenLogprob> prompt_logprobs_;
  std::vector<float> score_logprobs_;
  int prompt_tokens_;
  int completion_tokens_ = 0;
  int cached_tokens_ = 0;
  spec::SpecRequestStats spec_;
};

}  // namespace kiln::server
