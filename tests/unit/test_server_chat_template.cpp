// Chat templates through the server's request path (TokenizerCodec + parse_chat_request) with the real
// Qwen3 tokenizer and other checkpoints' templates: the prompt is the template's rendering, and a template
// that raises or does not parse is a 400 naming the template error, param "messages".
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_support.h"
#include "server/api_error.h"
#include "server/backend_engine.h"
#include "server/protocol.h"
#include "test_tokenizer_util.h"

namespace {

using nlohmann::json;
using nlohmann::ordered_json;
namespace server = kiln::server;

server::ApiLimits limits() {
  server::ApiLimits l;
  l.vocab_size = 151936;
  l.max_context_len = 4096;
  l.hidden_size = 8;
  l.served_model_name = "demo";
  return l;
}

// The real Qwen3 tokenizer with another checkpoint's template (from the oracle goldens) in its config.
server::TokenizerCodec codec_with(const std::string& chat_template, const std::string& bos = "") {
  json cfg = json::parse(kiln::test::read_text(kiln::test::qwen3_tokenizer_dir() + "/tokenizer_config.json"));
  cfg["chat_template"] = chat_template;
  if (!bos.empty()) cfg["bos_token"] = bos;
  return server::TokenizerCodec(kiln::Tokenizer::from_json(
      kiln::test::read_text(kiln::test::qwen3_tokenizer_dir() + "/tokenizer.json"), cfg.dump()));
}

std::string golden_source(const std::string& name) {
  std::ifstream f(std::string(KILN_SOURCE_DIR) + "/tests/fixtures/chat_templates/goldens.json");
  return ordered_json::parse(f)["templates"][name]["source"].get<std::string>();
}

TEST(ServerChatTemplate, PromptIsTheTemplatesRendering) {
  KILN_REQUIRE_QWEN3();
  const auto codec = codec_with(golden_source("real/llama3_1"), "<|begin_of_text|>");
  const json body = {
      {"model", "demo"},
      {"messages",
       {{{"role", "system"}, {"content", " Be brief. "}}, {{"role", "user"}, {"content", "Hi"}}}}};
  const server::GenSpec g = server::parse_chat_request(body, codec, limits());
  const std::string want =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe "
      "brief.<|eot_id|><|start_header_id|>user<|end_header_id|>"
      "\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(tk->decode(g.prompt), want);
}

TEST(ServerChatTemplate, RaisingTemplateIsA400NamingTheError) {
  KILN_REQUIRE_QWEN3();
  const auto codec = codec_with(golden_source("real/gemma3"));
  const json body = {
      {"model", "demo"},
      {"messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}}}};
  try {
    server::parse_chat_request(body, codec, limits());
    ADD_FAILURE() << "no error";
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "messages");
    kiln::test_support::expect_contains(e.what(), {"could not be rendered with the chat template", "line 19",
                                                   "Conversation roles must alternate"});
  }
}

TEST(ServerChatTemplate, BrokenTemplateIsA400NamingTheSyntaxError) {
  KILN_REQUIRE_QWEN3();
  const auto codec = codec_with("{% for m in messages %}{{ m.content }");
  const json body = {{"model", "demo"}, {"messages", {{{"role", "user"}, {"content", "a"}}}}};
  try {
    server::parse_chat_request(body, codec, limits());
    ADD_FAILURE() << "no error";
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    kiln::test_support::expect_contains(e.what(), {"does not parse", "template syntax error (line 1)"});
  }
}

}  // namespace
