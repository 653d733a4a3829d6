// CompiledGrammar: the flattened grammar and its adaptive token-mask cache. One cache entry per
// (lexeme position, DFA state) holds, for a stack whose top is there, the tokens accepted whatever lies
// below the top's rule (copied into the mask as they are), and the "uncertain" tokens that leave the rule
// part-way, each with the byte offsets where it leaves: the matcher checks only those against the real
// stack. Every other token is rejected whatever the context.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/vocab.h"
#include "kiln/grammar.h"

namespace kiln::grammar {

struct KeyMask {
  TokenSet accepted;
  std::vector<int32_t> uncertain;      // token ids
  std::vector<uint32_t> offset_begin;  // uncertain[i]'s exit offsets: offsets[offset_begin[i], [i + 1])
  std::vector<uint16_t> offsets;
};

class CompiledGrammar {
 public:
  CompiledGrammar(FlatGrammar g, std::shared_ptr<const TokenVocab> vocab, const CompileOptions& options);

  const FlatGrammar& flat() const { return g_; }
  const TokenVocab& vocab() const { return *vocab_; }
  const std::shared_ptr<const TokenVocab>& vocab_ptr() const { return vocab_; }
  const CompileOptions& options() const { return options_; }
  // The cache entry of a top; computed on first use (thread-safe).
  const KeyMask& key(uint32_t pos, int32_t state) const;
  void precompute_all() const;
  size_t num_keys_computed() const;

 private:
  std::unique_ptr<KeyMask> compute(uint32_t pos, int32_t state) const;
  FlatGrammar g_;
  std::shared_ptr<const TokenVocab> vocab_;
  CompileOptions options_;
  mutable std::unique_ptr<std::atomic<const KeyMask*>[]> keys_;
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<KeyMask>> owned_;
};

}  // namespace kiln::grammar
