// Helpers for the grammar engine's tests: a small synthetic byte-level vocabulary (every byte, plus
// multi-byte tokens that cross JSON structure), a mask-versus-accept oracle, and seeded random walks.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "grammar/compiled.h"
#include "kiln/grammar.h"

namespace kiln::grammar::testing {

inline std::vector<std::string> small_vocab_bytes() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, char(b)));
  for (const char* t : {"{\"",      "\":",
                        "\",",      "\"}",
                        " \"",      "true",
                        "false",    "null",
                        "12",       "abc",
                        "\n  ",     "  ",
                        "\"a",      "\xC3\xA9",
                        "\\n",      "},",
                        "]}",       ", \"",
                        "\":\"",    "\"]",
                        "[{",       "\": ",
                        "0.5",      "-1",
                        "e+",       "\\u00",
                        "\\\"",     "name",
                        "\"name\"", "ab",
                        "a\"",      "x\",\"",
                        "1,",       "]",
                        "\":[",     "\xE4\xB8",
                        "\xAD",     "\xF0\x9F\x98\x80",
                        "\", \"",   "}}",
                        "\n",       "\t\"",
                        "aa",       "aaa",
                        "2024",     "-0",
                        "T1",       ":00",
                        "@",        ".com",
                        "id",       "\"id\""})
    v.push_back(t);
  v.push_back("");  // EOS
  return v;
}

inline std::shared_ptr<const TokenVocab> small_vocab() {
  auto b = small_vocab_bytes();
  const int32_t eos = int32_t(b.size() - 1);
  return make_vocab(std::move(b), {eos});
}

inline bool bit(const std::vector<uint32_t>& m, int32_t id) {
  return (m[size_t(id) >> 5] >> (id & 31)) & 1;
}

// The mask must be exactly the set of tokens accept_token takes.
inline void expect_mask_exact(Matcher& m, const TokenVocab& v, const std::string& where) {
  std::vector<uint32_t> mask(mask_words(v) + 1);
  m.fill_next_token_bitmask(mask.data(), mask.size());
  for (int32_t t = 0; t < int32_t(vocab_size(v)); ++t) {
    const bool ok = m.accept_token(t);
    if (ok) m.rollback(1);
    ASSERT_EQ(ok, bit(mask, t)) << "token " << t << " (" << v.bytes(t) << ") at " << where;
  }
}

// Feeds text one byte token at a time (the small vocabulary has every byte); then whether it may end here.
inline bool accepts_bytes(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  Matcher m(g);
  for (char c : text)
    if (!m.accept_token(int32_t(uint8_t(c)))) return false;
  return m.is_complete();
}

// A seeded random walk that samples from the mask; returns the text. Checks the oracle at every step when
// `oracle` is set. Ends at EOS or after max_tokens.
inline std::string random_walk(const std::shared_ptr<const CompiledGrammar>& g, uint64_t seed, int max_tokens,
                               bool oracle, bool* ended = nullptr) {
  const TokenVocab& v = g->vocab();
  Matcher m(g);
  std::mt19937_64 rng(seed);
  std::string out;
  std::vector<uint32_t> mask(mask_words(v));
  for (int i = 0; i < max_tokens; ++i) {
    if (oracle) {
      expect_mask_exact(m, v, out);
      if (::testing::Test::HasFatalFailure()) return out;
    }
    m.fill_next_token_bitmask(mask.data(), mask.size());
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < int32_t(vocab_size(v)); ++t)
      if (bit(mask, t)) allowed.push_back(t);
    EXPECT_FALSE(allowed.empty()) << "dead end after " << out;
    if (allowed.empty()) return out;
    // Favour EOS a little so walks end; otherwise uniform.
    int32_t pick = allowed[rng() % allowed.size()];
    for (int32_t e : v.eos_ids())
      if (bit(mask, e) && rng() % 4 == 0) pick = e;
    EXPECT_TRUE(m.accept_token(pick));
    if (v.is_eos(pick)) {
      if (ended) *ended = true;
      return out;
    }
    out += v.bytes(pick);
  }
  if (ended) *ended = false;
  return out;
}

}  // namespace kiln::grammar::testing
