// kiln tokenizer: the Qwen3 byte-level BPE tokenizer read from a Hugging Face tokenizer.json, its chat
// template, and a streaming detokenizer. Token-for-token equal to the Hugging Face `tokenizers` package.
//
// Contract:
//  - encode(text): UTF-8 in (invalid UTF-8 throws kiln::Error naming the byte offset), ids out. No special
//    tokens are added (encode(text, true) adds the post_processor's: what chat prompts must not get).
//    Pipeline: added tokens that are not `normalized` are split off the raw text (leftmost-longest, honouring
//    lstrip/rstrip/single_word) -> NFC on the rest -> `normalized` added tokens split off -> the Split regex
//    from tokenizer.json (PCRE2, UTF+UCP, JIT) -> byte-level BPE by merge rank.
//  - decode(ids): tokens -> bytes through the ByteLevel decoder, then bytes -> text with U+FFFD replacing
//  each
//    maximal invalid subsequence (what Rust's from_utf8_lossy and Hugging Face do). Ids outside
//    [0, vocab_size()) throw kiln::Error (Hugging Face silently drops them; we report bad input).
//  - The object is immutable after load(); copies share one Impl and every method is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

class Tokenizer {
 public:
  // model_dir holds tokenizer.json and tokenizer_config.json (the latter may be absent: no chat template,
  // eos from <|im_end|>/<|endoftext|> only), and chat_template.jinja / chat_template.json where the
  // checkpoint ships its template in a file of its own.
  static Tokenizer load(const std::string& model_dir);
  // The same from the files' contents ("" for a file that is absent; tests build variants this way).
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json = "",
                             std::string_view chat_template_jinja = "",
                             std::string_view chat_template_json = "");

  std::vector<int32_t> encode(std::string_view text) const;
  // With add_special_tokens, the tokens of tokenizer.json's post_processor (TemplateProcessing, Bert/Roberta;
  // a Sequence of them; ByteLevel adds none) around the text, as transformers' tokenizer(text) adds them by
  // default -- Qwen3-Embedding appends <|endoftext|>. Without, exactly encode(text) (and a + b for a pair).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  std::vector<int32_t> encode_pair(std::string_view a, std::string_view b, bool add_special_tokens) const;
  bool adds_special_tokens() const;  // whether encode(text, true) can differ from encode(text)
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int64_t vocab_size() const;  // model vocab + added tokens (max id + 1)
  std::optional<int32_t> token_id(std::string_view token) const;
  // The token's text as stored in the vocabulary (byte-level chars for model tokens); throws when out of
  // range.
  std::string id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;  // an added token with "special": true (skipped by skip_special_tokens)
  // eos_token from tokenizer_config.json, then <|im_end|> and <|endoftext|> where present; no duplicates.
  std::vector<int32_t> eos_token_ids() const;

  // request_json: {"messages": [...], "tools"?: [...], "documents"?: [...], "add_generation_prompt"?: bool,
  // any other key a template variable (enable_thinking, ...)}. Returns the prompt text exactly as
  // transformers' apply_chat_template renders the checkpoint's Jinja template
  // (src/tokenizer/chat_template.h). Throws kiln::Error for malformed requests, a template that does not
  // parse, or one that raises.
  std::string render_chat(std::string_view request_json) const;
  // One line for logs: where the chat template came from and how it renders ("none" without one; a
  // template that does not parse says so and why: render_chat then throws that error).
  std::string chat_template_info() const;

  // Appends the decoded bytes of one id (no UTF-8 repair) to out; for StreamDecoder.
  void append_token_bytes(int32_t id, bool skip_special_tokens, std::string& out) const;

 private:
  struct Impl;  // src/tokenizer/tokenizer_impl.h
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Incremental detokenizer: push ids one at a time; each call returns the text that is now final (complete
// UTF-8, or invalid bytes already replaced by U+FFFD). flush() returns the rest. The concatenation of all
// returned strings equals tokenizer.decode(all ids, skip_special_tokens) exactly.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);
  std::string push(int32_t id);
  std::string flush();

 private:
  Tokenizer tokenizer_;  // shares the Impl: cheap, and keeps it alive
  bool skip_special_;
  std::string pending_;  // bytes not yet emitted: at most an incomplete UTF-8 sequence (<= 3 bytes)
};

}  // namespace kiln
