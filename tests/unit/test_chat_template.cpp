// The native Qwen3 chat template against Jinja2 renders of the real template (chat_goldens.json, made by
// scripts/tokenizer_goldens_chat.py with Hugging Face's Jinja settings, and cross-checked on the device
// machine against transformers' apply_chat_template: goldens_hf.json "chat").
#include "test_tokenizer_util.h"

namespace {

using kiln::test::fixture;
using nlohmann::json;

TEST(ChatTemplate, MatchesJinjaGoldens) {
  KILN_REQUIRE_QWEN3();
  // ordered_json: the request's key order must survive to the renderer (tojson keeps it).
  const auto cases = fixture<nlohmann::ordered_json>("chat_goldens.json")["cases"];
  ASSERT_GE(cases.size(), 20u);
  for (const auto& c : cases) {
    // The request is passed as text, exactly as `kiln chat-template` gets it (key order matters for tojson).
    EXPECT_EQ(tk->render_chat(c["request"].dump()), c["rendered"].get<std::string>()) << c["name"];
  }
}

TEST(ChatTemplate, JinjaGoldensAgreeWithTransformers) {
  const json cases = fixture("chat_goldens.json")["cases"], hf = fixture("goldens_hf.json")["chat"];
  ASSERT_TRUE(hf["error"].is_null()) << hf["error"];
  ASSERT_EQ(cases.size(), hf["rendered"].size());
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(cases[i]["rendered"], hf["rendered"][i]) << cases[i]["name"];
}

TEST(ChatTemplate, KeyOrderAndUnicodeSurviveTojson) {
  KILN_REQUIRE_QWEN3();
  const std::string req =
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",
    "tool_calls": [{"function": {"name": "f", "arguments": {"z": 1, "a": "é\u0001", "m": [0.1, 2.0, 1e300]}}}]}]})";
  const std::string out = tk->render_chat(req);
  EXPECT_NE(out.find(R"({"name": "f", "arguments": {"z": 1, "a": "é\u0001", "m": [0.1, 2.0, 1e+300]}})"),
            std::string::npos)
      << out;
}

TEST(ChatTemplate, ExtensionsWhereJinjaWouldRaise) {
  KILN_REQUIRE_QWEN3();
  // null content renders as "" and text parts are concatenated.
  EXPECT_EQ(tk->render_chat(R"({"messages": [{"role": "user", "content": null}]})"),
            "<|im_start|>user\n<|im_end|>\n");
  EXPECT_EQ(tk->render_chat(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
            {"type": "text", "text": "b"}]}]})"),
            "<|im_start|>user\nab<|im_end|>\n");
}

TEST(ChatTemplate, BadRequestsAreClearErrors) {
  KILN_REQUIRE_QWEN3();
  const char* bad[] = {
      "not json",
      "[]",
      R"({"messages": "hi"})",
      R"({"messages": [{"content": "no role"}]})",
      R"({"messages": [{"role": "user", "content": 5}]})",
      R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
      R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}]})",
      R"({"messages": [{"role": "assistant", "content": "x", "reasoning_content": 3}]})",
      R"({"messages": [], "tools": {"not": "a list"}})",
  };
  for (const char* r : bad) EXPECT_THROW(tk->render_chat(r), kiln::Error) << r;
}

// A template other than the fingerprinted Qwen3 one renders through the Jinja interpreter (here the Qwen3
// template with one trailing space, which Jinja prints after the prompt).
TEST(ChatTemplate, OtherTemplatesRenderThroughTheInterpreter) {
  KILN_REQUIRE_QWEN3();
  json cfg = json::parse(kiln::test::read_text(kiln::test::qwen3_tokenizer_dir() + "/tokenizer_config.json"));
  cfg["chat_template"] = cfg["chat_template"].get<std::string>() + " ";
  const auto other = kiln::Tokenizer::from_json(
      kiln::test::read_text(kiln::test::qwen3_tokenizer_dir() + "/tokenizer.json"), cfg.dump());
  const std::string req =
      R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true})";
  EXPECT_EQ(other.render_chat(req), tk->render_chat(req) + " ");
}

// A template that does not parse: the tokenizer loads, rendering names the template error.
TEST(ChatTemplate, BrokenTemplateIsAClearErrorWhenRendered) {
  KILN_REQUIRE_QWEN3();
  json cfg = json::parse(kiln::test::read_text(kiln::test::qwen3_tokenizer_dir() + "/tokenizer_config.json"));
  cfg["chat_template"] = "{% for m in messages %}{{ m.content }}\n{% endif %}";
  const auto broken = kiln::Tokenizer::from_json(
      kiln::test::read_text(kiln::test::qwen3_tokenizer_dir() + "/tokenizer.json"), cfg.dump());
  try {
    broken.render_chat(R"({"messages": [{"role": "user", "content": "hi"}]})");
    ADD_FAILURE() << "a broken template rendered";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "does not parse: template syntax error (line 2): unexpected 'endif', expected 'endfor'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
