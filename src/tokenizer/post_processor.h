// tokenizer.json's post_processor: the special tokens Hugging Face adds around encoded text when
// add_special_tokens is true (transformers' default for tokenizer(text); chat templates render their own
// and tokenize without them). Supported: TemplateProcessing (single and pair), BertProcessing,
// RobertaProcessing, ByteLevel (offsets only: no ids change) and a Sequence of these.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace kiln::tok {

class PostProcessor {
 public:
  // j: the post_processor value (null: none). Token ids must be < vocab_size. Throws kiln::Error naming
  // the field for an unsupported type or a malformed template.
  static PostProcessor parse(const nlohmann::json& j, int64_t vocab_size);

  // The ids of `a` (and `b` for a pair) with the special tokens placed as the processors say.
  // add_special_tokens false: a then b, nothing added (as Hugging Face does).
  std::vector<int32_t> apply(const std::vector<int32_t>& a, const std::vector<int32_t>* b,
                             bool add_special_tokens) const;
  // True when apply(..., true) can add a token to a single sequence.
  bool adds_tokens() const;

 private:
  // One template piece: a sequence (0 = A, 1 = B) or literal special-token ids.
  struct Piece {
    int sequence = -1;
    std::vector<int32_t> ids;
  };
  struct Template {
    std::vector<Piece> single, pair;
  };
  std::vector<Template> steps_;  // applied in order (ByteLevel contributes none)

  static void parse_into(const nlohmann::json& j, int64_t vocab_size, const std::string& where,
                         std::vector<Template>& out);
};

}  // namespace kiln::tok
