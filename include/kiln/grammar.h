// kiln grammar engine: structured output. A grammar (JSON Schema, regular expression, EBNF, or any JSON) is
// compiled against the model's vocabulary into an immutable CompiledGrammar; a Matcher per request walks it
// token by token and gives, before each step, the bitmask of the tokens that keep the output inside the
// grammar. src/grammar/README.md is the contract (what each front end supports, limits, complexity).
//
// Thread safety: TokenVocab and CompiledGrammar are immutable after construction (their internal caches are
// locked) and may be shared by any number of threads; a Matcher belongs to one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/error.h"

namespace kiln::grammar {

class TokenVocab;       // src/grammar/vocab.h
class CompiledGrammar;  // src/grammar/compiled.h

// token_bytes[id]: the bytes token id decodes to; "" for ids a grammar must never produce (special tokens,
// padding ids). eos_ids are allowed exactly where the grammar is complete.
std::shared_ptr<const TokenVocab> make_vocab(std::vector<std::string> token_bytes,
                                             std::vector<int32_t> eos_ids);
size_t vocab_size(const TokenVocab& v);
size_t mask_words(const TokenVocab& v);  // uint32 words of a token bitmask: ceil(vocab_size / 32)

struct CompileOptions {
  bool lenient = false;        // JSON Schema: drop keywords the engine cannot enforce instead of refusing
  bool strict = false;         // JSON Schema: additionalProperties defaults to false (OpenAI `strict`)
  int max_whitespace = 24;     // JSON: longest whitespace run between two tokens of the document
  uint32_t max_depth = 512;    // parser stack depth (nesting) limit
  uint32_t max_stacks = 4096;  // parse stacks alive at once (ambiguity) limit
  bool precompute = false;     // compute the whole mask cache at compile time (else on first use)
};

// A JSON Schema keyword the engine cannot enforce (refused unless CompileOptions::lenient).
class UnsupportedKeyword : public Error {
 public:
  explicit UnsupportedKeyword(std::string keyword)
      : Error("unsupported: " + keyword), keyword_(std::move(keyword)) {}
  const std::string& keyword() const { return keyword_; }

 private:
  std::string keyword_;
};

// tool_calls: Qwen3's <tool_call> blocks, the text a JSON spec {"tools": [{"name", "parameters"}],
// "min_calls": 0|1, "max_calls": 0 (no limit) | n >= 1, "free_text": text before the calls (needed for
// min_calls 0)} (src/grammar/README.md, "Front ends").
enum class GrammarKind { json_schema, regex, ebnf, any_json, tool_calls };

// Throws UnsupportedKeyword or kiln::Error (malformed input, a grammar that can never finish, limits).
std::shared_ptr<const CompiledGrammar> compile(GrammarKind kind, std::string_view text,
                                               std::shared_ptr<const TokenVocab> vocab,
                                               const CompileOptions& options = {});

// Compiled grammars cached by content (kind, text, options); thread-safe. With max_entries > 0 the oldest
// entry goes when a new one would pass it (a server's cache stays bounded); 0: entries live as long as the
// cache.
class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const TokenVocab> vocab, size_t max_entries = 0)
      : vocab_(std::move(vocab)), max_entries_(max_entries) {}
  std::shared_ptr<const CompiledGrammar> get(GrammarKind kind, std::string_view text,
                                             const CompileOptions& options = {});
  size_t size() const;

 private:
  std::shared_ptr<const TokenVocab> vocab_;
  size_t max_entries_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const CompiledGrammar>> entries_;
  std::deque<std::string> order_;  // keys, oldest first
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~Matcher();
  Matcher(Matcher&&) noexcept;

  // Writes the allowed-token bitmask (bit id%32 of word id/32) into words[0, n_words); bits past the
  // vocabulary are 0. n_words >= mask_words(vocab). EOS ids are set only where is_complete().
  void fill_next_token_bitmask(uint32_t* words, size_t n_words);
  // Advances by one token; false (and no change) when the token leaves the grammar.
  bool accept_token(int32_t id);
  // Undoes the last n accepted tokens (n <= tokens accepted).
  void rollback(size_t n);
  bool is_complete() const;    // the output may end here (EOS is allowed)
  bool is_terminated() const;  // EOS was accepted
  size_t num_accepted() const;
  size_t mask_words() const;  // words fill_next_token_bitmask writes: mask_words(the grammar's vocab)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::grammar
