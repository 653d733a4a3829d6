// The grammar engine's view of a tokenizer: each id's bytes, special tokens excluded, EOS ids allowed only
// where a grammar is complete. Shared by `kiln grammar check` and `kiln bench grammar`.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/grammar.h"
#include "kiln/tokenizer.h"

namespace kiln::cli {

inline std::shared_ptr<const grammar::TokenVocab> grammar_vocab(const Tokenizer& tk) {
  std::vector<std::string> bytes(size_t(tk.vocab_size()));
  for (int32_t id = 0; id < int32_t(bytes.size()); ++id)
    if (!tk.is_special(id)) tk.append_token_bytes(id, false, bytes[size_t(id)]);
  return grammar::make_vocab(std::move(bytes), tk.eos_token_ids());
}

}  // namespace kiln::cli
