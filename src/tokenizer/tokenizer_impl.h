// Tokenizer::Impl: everything load() reads, immutable afterwards (shared by all copies of a Tokenizer).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/tokenizer.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pretokenizer.h"

namespace kiln {

struct Tokenizer::Impl {
  std::unique_ptr<tok::BpeModel> bpe;
  bool nfc = false;                        // normalizer: NFC or none
  std::unique_ptr<tok::SplitRegex> split;  // null: the whole (normalized) text is one pre-token
  tok::AddedMatcher raw_added;             // added tokens with normalized=false
  tok::AddedMatcher normalized_added;      // added tokens with normalized=true
  std::vector<tok::AddedToken> added;      // all of them
  tok::PostProcessor post;                 // special tokens for add_special_tokens
  int64_t vocab_size = 0;
  std::vector<std::string> id_bytes;  // decoded bytes of every id (empty string for holes)
  std::vector<uint8_t> id_kind;       // 0 hole, 1 model token, 2 added, 3 added special
  std::vector<int32_t> eos_ids;
  std::shared_ptr<const tok::ChatTemplate> chat;  // never null; empty() when the checkpoint has none

  void encode_text(std::string_view text, std::vector<int32_t>& out) const;  // after added-token splitting
};

}  // namespace kiln
