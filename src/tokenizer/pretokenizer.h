// The Split pre-tokenizer: the regex from tokenizer.json (written for Oniguruma, which Hugging Face uses),
// translated to PCRE2 syntax with the same character classes and run with UTF + UCP and JIT.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tok {

// Rewrites the Oniguruma escapes whose meaning differs in PCRE2: \s \S (White_Space), \w \W (letters, marks,
// Nd, Pc), \d \D (Nd), \h \H (hex digit in Oniguruma, horizontal space in PCRE2). Everything else is the same
// syntax in both. Throws kiln::Error for a negated class escape inside a character class ([\S...]).
std::string onig_to_pcre2(std::string_view pattern);

class SplitRegex {
 public:
  // behavior: Hugging Face SplitDelimiterBehavior ("Isolated" is what Qwen3 uses; "Removed",
  // "MergedWithPrevious", "MergedWithNext" and "Contiguous" are supported too); invert as in tokenizer.json.
  SplitRegex(std::string_view onig_pattern, std::string_view behavior, bool invert);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Appends the pieces of text (valid UTF-8) as [begin, end) byte offsets into text, in order, none empty.
  // Thread-safe: match state is per call.
  void split(std::string_view text, std::vector<std::pair<size_t, size_t>>& pieces) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
  enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous } behavior_;
  bool invert_;
};

}  // namespace kiln::tok
