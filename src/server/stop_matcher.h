// StopMatcher: finds stop strings in streamed text, also when one spans several tokens. Text that could
// still turn into a stop string is held back until it cannot; text before a match is released and the
// stop string itself is dropped (OpenAI and SGLang both trim it).
//
// Invariant: released text + held-back text == everything pushed (until a match). Stop strings are
// non-empty and valid UTF-8, so held-back text always starts on a character boundary.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kiln::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;      // safe to send now
    bool matched = false;  // a stop string completed; `text` ends right before it
    std::string stop;      // which one
  };
  // After a match, further pushes return nothing.
  Result push(std::string_view delta);
  // End of stream without a match: whatever was held back.
  std::string finish();
  bool matched() const { return matched_; }
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool matched_ = false;
};

}  // namespace kiln::server
