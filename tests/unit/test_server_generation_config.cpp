// generation_config.json as request defaults (server/generation_config.h) and how the request parsers
// apply them: unset fields take the defaults, set fields win, the eos list joins stop_token_ids unless
// ignore_eos.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/test_support.h"
#include "kiln/error.h"
#include "server/generation_config.h"
#include "server/protocol.h"
#include "test_server_fakes.h"

using namespace kiln;
using namespace kiln::server;
using nlohmann::json;

namespace {

// Qwen3-4B's file as the hub ships it.
const char* kQwen3 = R"({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
  "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"})";

ApiLimits limits_with_defaults() {
  ApiLimits l;
  l.vocab_size = fake::kVocab;
  l.max_context_len = 512;
  l.served_model_name = "demo";
  l.sampling_defaults.temperature = 0.6f;
  l.sampling_defaults.top_p = 0.95f;
  l.sampling_defaults.top_k = 20;
  l.sampling_defaults.min_p = 0.05f;
  l.sampling_defaults.repetition_penalty = 1.05f;
  l.extra_eos_ids = {257, 258};
  return l;
}

json chat(json extra = json::object()) {
  json b = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  b.update(extra);
  return b;
}

}  // namespace

TEST(GenerationConfig, Qwen3FileGivesItsDefaultsAndBothEosIds) {
  const GenerationDefaults d = parse_generation_config(kQwen3, 151936);
  EXPECT_FLOAT_EQ(d.sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(d.sampling.top_p, 0.95f);
  EXPECT_EQ(d.sampling.top_k, 20);
  EXPECT_FLOAT_EQ(d.sampling.min_p, 0.0f);  // not in the file: SamplingParams' own
  EXPECT_EQ(d.eos_ids, (std::vector<int32_t>{151645, 151643}));
  EXPECT_TRUE(d.warnings.empty());
  EXPECT_EQ(d.applied.size(), 4u);
  // Checkpoints that ship a repetition penalty (Qwen2.5's 1.05) have it applied.
  const GenerationDefaults r = parse_generation_config(R"({"repetition_penalty": 1.05})", 100);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.05f);
  EXPECT_TRUE(r.warnings.empty());
}

TEST(GenerationConfig, BadValuesAreWarnedAndNotApplied) {
  const GenerationDefaults d = parse_generation_config(
      R"({"temperature": 7, "top_p": 0, "top_k": 1.5, "min_p": 0.1, "repetition_penalty": 3,
          "eos_token_id": [5, 999, 5]})",
      100);
  EXPECT_FLOAT_EQ(d.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(d.sampling.top_p, 1.0f);
  EXPECT_EQ(d.sampling.top_k, -1);
  EXPECT_FLOAT_EQ(d.sampling.min_p, 0.1f);
  EXPECT_EQ(d.eos_ids, (std::vector<int32_t>{5}));
  EXPECT_FLOAT_EQ(d.sampling.repetition_penalty, 1.0f);
  EXPECT_EQ(d.warnings.size(), 5u);  // temperature, top_p, top_k, repetition_penalty, eos 999
  EXPECT_EQ(parse_generation_config(R"({"eos_token_id": 7})", 100).eos_ids, (std::vector<int32_t>{7}));
  EXPECT_THROW(parse_generation_config("{", 100), kiln::Error);
  EXPECT_THROW(parse_generation_config("[1]", 100), kiln::Error);
}

TEST(GenerationConfig, LoadsFromTheCheckpointDirectory) {
  const auto dir = test_support::process_scratch_dir("gencfg");
  EXPECT_TRUE(load_generation_config(dir.string(), 151936).eos_ids.empty());  // no file: no defaults
  std::ofstream(dir / "generation_config.json") << kQwen3;
  EXPECT_EQ(load_generation_config(dir.string(), 151936).sampling.top_k, 20);
}

TEST(GenerationConfig, RequestsTakeDefaultsForWhatTheyLeaveUnset) {
  fake::ByteCodec codec;
  const ApiLimits lim = limits_with_defaults();
  GenSpec g = parse_chat_request(chat(), codec, lim);
  EXPECT_FLOAT_EQ(g.sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(g.sampling.top_p, 0.95f);
  EXPECT_EQ(g.sampling.top_k, 20);
  EXPECT_FLOAT_EQ(g.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(g.sampling.repetition_penalty, 1.05f);
  EXPECT_EQ(g.sampling.stop_token_ids, (std::vector<int32_t>{257, 258}));
  EXPECT_FLOAT_EQ(
      parse_chat_request(chat({{"repetition_penalty", 1.0}}), codec, lim).sampling.repetition_penalty, 1.0f);
  // Set fields win; stop_token_ids are merged without duplicates; top_k 0 (disabled) is set too.
  g = parse_chat_request(chat({{"temperature", 0}, {"top_k", 0}, {"stop_token_ids", {258, 42}}}), codec, lim);
  EXPECT_FLOAT_EQ(g.sampling.temperature, 0.0f);
  EXPECT_EQ(g.sampling.top_k, -1);
  EXPECT_FLOAT_EQ(g.sampling.top_p, 0.95f);
  EXPECT_EQ(g.sampling.stop_token_ids, (std::vector<int32_t>{258, 42, 257}));
  // ignore_eos: the checkpoint's eos ids do not stop it either.
  g = parse_chat_request(chat({{"ignore_eos", true}}), codec, lim);
  EXPECT_TRUE(g.sampling.stop_token_ids.empty());
  // The other endpoints too.
  g = parse_completion_request({{"prompt", "hi"}, {"top_p", 0.5}}, codec, lim);
  EXPECT_FLOAT_EQ(g.sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(g.sampling.top_p, 0.5f);
  EXPECT_EQ(g.sampling.stop_token_ids, (std::vector<int32_t>{257, 258}));
  g = parse_generate_request({{"text", "hi"}}, codec, lim);
  EXPECT_EQ(g.sampling.top_k, 20);
  EXPECT_EQ(g.sampling.stop_token_ids, (std::vector<int32_t>{257, 258}));
  g = parse_generate_request({{"text", "hi"}, {"sampling_params", {{"temperature", 1.0}}}}, codec, lim);
  EXPECT_FLOAT_EQ(g.sampling.temperature, 1.0f);
  EXPECT_EQ(g.sampling.top_k, 20);
  // No defaults (--generation-config none): SamplingParams' own.
  ApiLimits none = lim;
  none.sampling_defaults = SamplingParams{};
  none.extra_eos_ids.clear();
  g = parse_chat_request(chat(), codec, none);
  EXPECT_FLOAT_EQ(g.sampling.temperature, 1.0f);
  EXPECT_TRUE(g.sampling.stop_token_ids.empty());
}
