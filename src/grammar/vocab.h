// The model's vocabulary as the grammar engine sees it: each token id's bytes, sorted into a trie so that
// tokens sharing a prefix share the parser work, plus a per-vocabulary cache of DFA walks (which tokens a
// lexeme consumes whole from a given DFA state): JSON strings, numbers and whitespace recur in every schema,
// so their big walks are done once per vocabulary, not once per grammar.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "grammar/fsm.h"

namespace kiln::grammar {

// A set of token ids: a bitmask when dense, a sorted id list when sparse.
struct TokenSet {
  std::vector<uint32_t> words;
  std::vector<int32_t> ids;
  static TokenSet from_ids(std::vector<int32_t> ids, size_t vocab_size);
  static TokenSet from_words(std::vector<uint32_t> words);
  void or_into(uint32_t* mask) const;
  bool contains(int32_t id) const;
  size_t count() const;
};

struct TrieNode {
  uint32_t first_child = 0, n_children = 0;
  uint32_t tok_lo = 0, tok_mid = 0, tok_hi = 0;  // sorted[tok_lo, tok_mid) end here, [tok_mid, tok_hi) below
  uint32_t depth = 0;
  uint8_t byte = 0;
};

// Which tokens a DFA consumes whole from one state (any live end state), and the trie nodes after which the
// DFA could also stop (accepting) while the token goes on: there the rest of the grammar takes over.
struct DfaWalk {
  TokenSet accepted;
  std::vector<uint32_t> exits;  // trie nodes with children, reached in an accepting state
};

class TokenVocab {
 public:
  // token_bytes[id]: the bytes the token decodes to; "" for ids a grammar never produces (special tokens,
  // unused ids). eos_ids: allowed exactly where the grammar is complete.
  TokenVocab(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids);

  size_t size() const { return bytes_.size(); }
  size_t mask_words() const { return (bytes_.size() + 31) / 32; }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  const std::vector<int32_t>& eos_ids() const { return eos_; }
  bool is_eos(int32_t id) const;
  const std::vector<TrieNode>& trie() const { return trie_; }
  const std::vector<int32_t>& sorted() const { return sorted_; }
  uint64_t hash() const { return hash_; }

  // Cached by (DFA content hash, state); thread-safe.
  std::shared_ptr<const DfaWalk> dfa_walk(const Dfa& d, int32_t state) const;

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> eos_;
  std::vector<int32_t> sorted_;  // usable ids by byte order
  std::vector<TrieNode> trie_;   // [0] is the root; children of a node are contiguous
  uint64_t hash_ = 0;
  mutable std::mutex mu_;
  mutable std::map<std::pair<uint64_t, int32_t>, std::shared_ptr<const DfaWalk>> walks_;  // by rooted hash
  mutable std::map<std::pair<uint64_t, int32_t>, uint64_t> rooted_;  // (DFA hash, state) -> rooted hash
};

}  // namespace kiln::grammar
