// kiln's Jinja interpreter against both oracles, byte for byte: tests/fixtures/chat_templates/goldens.json
// holds every (template, conversation) rendered by Jinja2 with transformers' settings and by
// @huggingface/jinja (scripts/chat_template_goldens.py). Templates: the real ones of the npm tokenizer
// packages and the feature templates beside the fixture. Where the two oracles differ, Jinja2 (what
// transformers runs) is the reference and the difference is listed in README.md.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/test_support.h"
#include "test_tokenizer_util.h"
#include "tokenizer/chat_template.h"

namespace {

using ojson = nlohmann::ordered_json;

const ojson& goldens() {
  static const ojson g = [] {
    std::ifstream f(std::string(KILN_SOURCE_DIR) + "/tests/fixtures/chat_templates/goldens.json");
    if (!f.good()) throw std::runtime_error("missing tests/fixtures/chat_templates/goldens.json");
    return ojson::parse(f);
  }();
  return g;
}

// A tokenizer_config.json carrying the template and its special tokens, as a checkpoint would.
std::shared_ptr<const kiln::tok::ChatTemplate> load(const std::string& name) {
  const ojson& t = goldens()["templates"][name];
  ojson cfg = t["special_tokens"];
  cfg["chat_template"] = t["source"];
  return kiln::tok::ChatTemplate::load(cfg.dump(), "", "");
}

TEST(ChatTemplateOracles, EveryCaseMatchesJinja2AndHuggingFaceJinja) {
  const ojson& cases = goldens()["cases"];
  ASSERT_GE(cases.size(), 40u);
  size_t rendered = 0, raised = 0, agreed = 0;
  for (const auto& c : cases) {
    const std::string name = c["template"].get<std::string>() + " x " + c["conversation"].get<std::string>();
    const auto ct = load(c["template"]);
    const std::string req = c["request"].dump();
    const ojson& want = c["jinja2"];
    if (want.contains("error")) {
      EXPECT_THROW(ct->render_interpreted(req), kiln::Error) << name << ": Jinja2 raised " << want["error"];
      ++raised;
      continue;
    }
    std::string got;
    try {
      got = ct->render_interpreted(req);
    } catch (const kiln::Error& e) {
      ADD_FAILURE() << name << ": raised " << e.what();
      continue;
    }
    EXPECT_EQ(got, want["out"].get<std::string>()) << name;
    if (c["oracles_agree"].get<bool>()) {
      EXPECT_EQ(got, c["hf_jinja"]["out"].get<std::string>()) << name;
      ++agreed;
    }
    ++rendered;
  }
  std::printf("%zu cases rendered equal to Jinja2 (%zu also to @huggingface/jinja), %zu raise as in Jinja2\n",
              rendered, agreed, raised);
}

// raise_exception's message reaches the error, with the template line.
TEST(ChatTemplateOracles, RaiseExceptionNamesTheMessageAndLine) {
  const auto ct = load("real/gemma3");
  try {
    ct->render(R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})");
    ADD_FAILURE() << "no error";
  } catch (const kiln::Error& e) {
    kiln::test_support::expect_contains(e.what(), {"Conversation roles must alternate", "line 19"});
  }
}

// The native Qwen3 renderer and the interpreter agree on every Qwen3 golden of the tokenizer fixtures.
TEST(ChatTemplateOracles, NativeQwen3EqualsInterpreter) {
  const auto ct = load("real/qwen3");
  const auto cases = kiln::test::fixture<ojson>("chat_goldens.json")["cases"];
  ASSERT_GE(cases.size(), 20u);
  for (const auto& c : cases) {
    const std::string req = c["request"].dump();
    EXPECT_EQ(ct->render_interpreted(req), c["rendered"].get<std::string>()) << c["name"];
    EXPECT_EQ(ct->render(req), c["rendered"].get<std::string>()) << c["name"];
  }
}

// The fixture is what the generator writes today (both oracles re-run). Skips where python3-jinja2, node
// or the npm packages are missing.
TEST(ChatTemplateOracles, FixtureIsCurrent) {
  const std::string root = KILN_SOURCE_DIR;
  if (std::system("python3 -c 'import jinja2' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3-jinja2 missing";
  if (std::system("node --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "node missing";
  if (!std::ifstream(root + "/.deps/npm/node_modules/@huggingface/jinja/package.json").good())
    GTEST_SKIP() << "@huggingface/jinja missing (scripts/bootstrap.sh installs it)";
  const std::string cmd = "cd '" + root + "' && python3 scripts/chat_template_goldens.py --check";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "goldens.json differs from what the oracles render now";
}

}  // namespace
