#include "server/backend_engine.h"

#include "kiln/error.h"

namespace kiln::server {
namespace {

class TokenizerStream : public TextStream {
 public:
  explicit TokenizerStream(const Tokenizer& t)
      : vocab_(t.vocab_size()), dec_(t, /*skip_special_tokens=*/true) {}
  std::string push(int32_t id) override { return id >= 0 && id < vocab_ ? dec_.push(id) : ""; }
  std::string flush() override { return dec_.flush(); }

 private:
  int64_t vocab_;
  StreamDecoder dec_;
};

}  // namespace

static bool template_thinks(const TokenizerCodec& c) {
  const nlohmann::json msgs = {{{"role", "user"}, {"content", "x"}}};
  try {
    for (bool on : {false, true}) {
      const std::string p =
          c.render_chat({{"messages", msgs}, {"chat_template_kwargs", {{"enable_thinking", on}}}});
      if (p.find("<think>") != std::string::npos) return true;
    }
  } catch (const kiln::Error&) {  // no template, or one kiln cannot render: nothing to parse either
  }
  return false;
}

TokenizerCodec::TokenizerCodec(Tokenizer t) : tok_(std::move(t)) {
  thinks_ = template_thinks(*this);
}

std::vector<int32_t> TokenizerCodec::encode(const std::string& text) const {
  return tok_.encode(text);
}

// As SentenceTransformer.encode tokenizes: with the post_processor's special tokens (Qwen3-Embedding's
// TemplateProcessing appends <|endoftext|>, whose hidden state is the pooled one).
std::vector<int32_t> TokenizerCodec::encode_embedding_input(const std::string& text) const {
  return tok_.encode(text, /*add_special_tokens=*/true);
}

std::string TokenizerCodec::decode(const std::vector<int32_t>& ids) const {
  std::vector<int32_t> known;
  known.reserve(ids.size());
  for (int32_t id : ids)
    if (id >= 0 && id < tok_.vocab_size()) known.push_back(id);
  return tok_.decode(known, /*skip_special_tokens=*/true);
}

std::string TokenizerCodec::token_bytes(int32_t id) const {
  std::string out;
  if (id >= 0 && id < tok_.vocab_size()) tok_.append_token_bytes(id, /*skip_special_tokens=*/false, out);
  return out;
}

std::unique_ptr<TextStream> TokenizerCodec::stream() const {
  return std::make_unique<TokenizerStream>(tok_);
}

std::string TokenizerCodec::render_chat(const nlohmann::json& request) const {
  nlohmann::json r = {{"messages", request.at("messages")}, {"add_generation_prompt", true}};
  for (const char* k : {"tools", "documents"})
    if (auto it = request.find(k); it != request.end() && !it->is_null()) r[k] = *it;
  if (auto kw = request.find("chat_template_kwargs"); kw != request.end() && kw->is_object())
    for (const auto& [k, v] : kw->items())
      if (!v.is_null()) r[k] = v;
  return tok_.render_chat(r.dump());
}

}  // namespace kiln::server
