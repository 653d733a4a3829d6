// The grammar fuzzers' shared harness (fuzz_grammar_schema.cpp, fuzz_grammar_ebnf.cpp): a small byte-level
// vocabulary, and a compile followed by a few seeded steps whose mask must be non-empty and whose tokens
// accept_token must take (every compiled grammar can finish).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/grammar.h"

namespace {
inline std::shared_ptr<const kiln::grammar::TokenVocab> vocab() {
  static auto v = [] {
    std::vector<std::string> b;
    for (int c = 0; c < 256; ++c) b.push_back(std::string(1, char(c)));
    for (const char* t : {"{\"", "\":", "\",", "\"}", "true", "null", "12", "ab", "\\n", "\"a"})
      b.push_back(t);
    b.push_back("");
    return kiln::grammar::make_vocab(b, {int32_t(b.size() - 1)});
  }();
  return v;
}
}  // namespace

// Compiles the input as `kind`; on success walks a few steps, trapping where mask and accept disagree.
inline int fuzz_grammar(kiln::grammar::GrammarKind kind, const uint8_t* data, size_t size) {
  using namespace kiln::grammar;
  std::shared_ptr<const CompiledGrammar> g;
  try {
    g = compile(kind, std::string(reinterpret_cast<const char*>(data), size), vocab());
  } catch (const kiln::Error&) {
    return 0;
  }
  Matcher m(g);
  std::vector<uint32_t> mask(mask_words(*vocab()));
  for (int step = 0; step < 8; ++step) {
    m.fill_next_token_bitmask(mask.data(), mask.size());
    int32_t pick = -1;
    for (size_t w = 0; w < mask.size() && pick < 0; ++w)
      if (mask[w]) pick = int32_t(w * 32 + size_t(__builtin_ctz(mask[w])));
    if (pick < 0) {
      if (step == 0 || !m.is_terminated()) __builtin_trap();  // a live grammar always allows some token
      break;
    }
    if (!m.accept_token(pick)) __builtin_trap();  // the mask promised it
    if (m.is_terminated()) break;
  }
  return 0;
}
