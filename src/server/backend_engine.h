// The real seams: kiln::Engine and kiln::Tokenizer behind the server's EngineApi / TextCodec.
#pragma once

#include <optional>

#include "kiln/tokenizer.h"
#include "runtime/engine.h"
#include "server/backend.h"

namespace kiln::server {

class EngineAdapter : public EngineApi {
 public:
  explicit EngineAdapter(Engine& e) : e_(e) {}
  RequestId submit(Request req, std::function<void(const TokenEvent&)> cb) override {
    return e_.submit(std::move(req), std::move(cb));
  }
  void abort(RequestId id) override { e_.abort(id); }
  void flush_cache() override { e_.flush_cache(); }
  EngineStats stats() const override { return e_.stats(); }
  int64_t vocab_size() const override { return e_.model_config().vocab_size; }
  int64_t max_context_len() const override { return e_.max_context_len(); }
  bool is_embedding_model() const override { return e_.is_embedding_model(); }
  int64_t hidden_size() const override { return e_.model_config().hidden_size; }
  std::vector<int32_t> eos_token_ids() const override {
    const auto& ids = e_.model_config().eos_token_ids;
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

 private:
  Engine& e_;
};

// Special tokens are skipped in generated text. A checkpoint's embedding matrix is often larger than the
// tokenizer's vocabulary (Qwen3: 151,936 rows, 151,669 tokens); ids past the tokenizer decode to "".
class TokenizerCodec : public TextCodec {
 public:
  explicit TokenizerCodec(Tokenizer t);
  std::vector<int32_t> encode(const std::string& text) const override;
  std::vector<int32_t> encode_embedding_input(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string token_bytes(int32_t id) const override;
  bool is_special(int32_t id) const override {
    return id >= 0 && id < tok_.vocab_size() && tok_.is_special(id);
  }
  std::unique_ptr<TextStream> stream() const override;
  // Maps the OpenAI request onto the tokenizer's: messages, tools, add_generation_prompt = true, and
  // chat_template_kwargs (enable_thinking) lifted to the top level.
  std::string render_chat(const nlohmann::json& request) const override;
  // Judged by rendering: a template that thinks writes <think> when enable_thinking is false (Qwen3's
  // empty block) or leaves one open in the generation prompt.
  bool chat_template_thinks() const override { return thinks_; }

 private:
  Tokenizer tok_;
  bool thinks_ = false;
};

}  // namespace kiln::server
