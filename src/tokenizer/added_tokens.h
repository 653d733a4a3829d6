// Added tokens (tokenizer.json "added_tokens"): found in the text before pre-tokenization, leftmost-longest,
// as Hugging Face's AddedVocabulary does: one matcher over the raw text for tokens with normalized=false,
// one over the normalized text for tokens with normalized=true (their content normalized too).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// One piece of a split: an added token's id, or text (id < 0).
struct AddedSplit {
  size_t begin, end;
  int32_t id;
};

class AddedMatcher {
 public:
  // patterns[i] is matched for tokens[i] (for normalized tokens, the NFC of its content).
  void build(std::vector<AddedToken> tokens, const std::vector<std::string>& patterns);
  bool empty() const { return tokens_.empty(); }
  // Splits text into added tokens and the text between them, covering it (HF find_matches): single_word
  // discards matches inside a word, lstrip/rstrip take the whitespace beside the token into it.
  void split(std::string_view text, std::vector<AddedSplit>& out) const;

 private:
  struct Node {
    std::array<int32_t, 256> next;
    int32_t token = -1;  // index into tokens_ when a pattern ends here
  };
  std::vector<Node> nodes_;
  std::vector<AddedToken> tokens_;
  std::array<bool, 256> first_{};
};

}  // namespace kiln::tok
