// Structured output in the engine: each constrained request's grammar state (a Matcher over the request's
// compiled grammar, advanced by every generated token), and the pool that computes a step's token masks on
// worker threads while the engine thread runs the forward pass.
//
// A request's grammar starts at its first token, or right after `after_token` (Qwen3's </think>: the
// reasoning is free, the answer constrained, as SGLang does). The mask of a step is computed from the
// tokens accepted so far, so it can run during that step's forward; the engine waits for it, at most until
// a deadline (EngineOptions::grammar_mask_timeout_ms), before sampling. A mask that misses it ends its own
// request with an error naming the limit; its worker finishes the job on a state the request no longer
// holds (shared ownership), and the other rows go on.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/grammar.h"

namespace kiln {

struct GrammarState {
  GrammarState(std::shared_ptr<const grammar::CompiledGrammar> g, int32_t after_token);

  grammar::Matcher matcher;
  int32_t after_token;  // -1: the grammar applies from the first token
  bool active;          // the grammar constrains the next token
  // Written by a mask worker between start() and the end of wait(); read by the engine after wait().
  std::vector<uint32_t> mask;  // [mask words]
  double mask_seconds = 0.0;   // the last mask's compute time
  std::string error;           // the last mask failed (a matcher limit): what happened

  // Advances the grammar by a generated token: "" on success, else why the grammar refused it. A token
  // outside any active grammar only switches it on when it is after_token.
  std::string advance(int32_t token);
  bool terminated() const { return active && matcher.is_terminated(); }
};

class GrammarMaskPool {
 public:
  // before_mask (may be null): runs on the worker before each mask (a test's slow worker).
  explicit GrammarMaskPool(int threads, std::function<void()> before_mask = {});
  ~GrammarMaskPool();
  GrammarMaskPool(const GrammarMaskPool&) = delete;
  GrammarMaskPool& operator=(const GrammarMaskPool&) = delete;

  // Starts computing the masks of `states` (the previous batch must have been waited for).
  void start(std::vector<std::shared_ptr<GrammarState>> states);
  // Waits for the started batch, at most until `deadline`; returns per state whether its mask is done.
  std::vector<bool> wait(std::chrono::steady_clock::time_point deadline);

 private:
  struct Batch {
    std::vector<std::shared_ptr<GrammarState>> states;
    std::vector<uint8_t> done;  // under the pool's mutex
    size_t next = 0;            // the next state a worker takes, under the pool's mutex
    size_t finished = 0;
  };
  void work();

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::shared_ptr<Batch> batch_;
  bool stop_ = false;
  std::function<void()> before_mask_;
  std::vector<std::thread> threads_;
};

}  // namespace kiln
