// The Qwen3-VL prompt: the checkpoint's own chat template (embedded from src/vision) rendered through kiln's
// interpreter, then each <|image_pad|> expanded to the image's merged token count, as transformers' processor
// does. The template's renders equal Jinja2's in test_chat_template_oracles (real/qwen3_vl).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/test_support.h"
#include "test_tokenizer_util.h"
#include "vision/image_tokens.h"
#include "vision/processor.h"
#include "vision/qwen3_vl_assets.h"

using namespace kiln::vision;

namespace {
ImagePatches patches(int t, int h, int w) {
  ImagePatches p;
  p.grid_t = t;
  p.grid_h = h;
  p.grid_w = w;
  return p;
}
}  // namespace

TEST(VisionTokens, EmbeddedAssetsAreTheFiles) {
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/src/vision/";
  EXPECT_EQ(qwen3_vl_chat_template(), kiln::test::read_text(dir + "qwen3_vl_chat_template.jinja"));
  EXPECT_EQ(qwen3_vl_preprocessor_config_json(),
            kiln::test::read_text(dir + "qwen3_vl_preprocessor_config.json"));
  const ProcessorConfig c = parse_processor_config(qwen3_vl_preprocessor_config_json());
  EXPECT_EQ(c.patch_size, 16);
  EXPECT_EQ(c.factor(), 32);
  EXPECT_EQ(c.min_pixels, 65536);
  EXPECT_EQ(c.max_pixels, 16777216);
  EXPECT_EQ(c.image_std[2], 0.5);
  EXPECT_EQ(c.kernel, ResampleKernel::torchvision);
}

TEST(VisionTokens, ExpandsEachPadToItsMergedTokens) {
  const VisionTokenIds t{10, 11, 12};
  const std::vector<int32_t> ids = {1, 10, 12, 11, 2, 10, 12, 11, 3};
  const auto out = expand_image_pads(ids, {patches(1, 4, 6), patches(1, 2, 2)}, t, 2);
  std::vector<int32_t> want = {1, 10};
  want.insert(want.end(), 6, 12);
  want.insert(want.end(), {11, 2, 10, 12, 11, 3});
  EXPECT_EQ(out, want);
  EXPECT_EQ(count_image_pads(ids, t), 2);
  using kiln::test_support::error_of;
  using kiln::test_support::expect_contains;
  expect_contains(error_of([&] { expand_image_pads(ids, {patches(1, 2, 2)}, t, 2); }),
                  {"2 image placeholder(s)", "1 image(s)"});
  expect_contains(error_of([&] {
                    expand_image_pads(std::vector<int32_t>{1, 12, 11}, {patches(1, 2, 2)}, t, 2);
                  }),
                  {"not between"});
  EXPECT_EQ(expand_image_pads(std::vector<int32_t>{1, 2}, {}, t, 2), (std::vector<int32_t>{1, 2}));
}

TEST(VisionTokens, ChatPromptFromTheRealTemplate) {
  const kiln::Tokenizer* base = kiln::test::qwen3();
  if (!base) GTEST_SKIP() << "the Qwen3 tokenizer files are absent (scripts/bootstrap.sh installs them)";
  const std::string dir = kiln::test::qwen3_tokenizer_dir();
  nlohmann::json cfg = nlohmann::json::parse(kiln::test::read_text(dir + "/tokenizer_config.json"));
  cfg.erase("chat_template");
  const std::string chat_template_json = nlohmann::json{{"chat_template", qwen3_vl_chat_template()}}.dump();
  const kiln::Tokenizer tok = kiln::Tokenizer::from_json(kiln::test::read_text(dir + "/tokenizer.json"),
                                                         cfg.dump(), "", chat_template_json);
  const VisionTokenIds ids{*tok.token_id("<|vision_start|>"), *tok.token_id("<|vision_end|>"),
                           *tok.token_id("<|image_pad|>")};
  EXPECT_EQ(ids.vision_start, 151652);
  EXPECT_EQ(ids.vision_end, 151653);
  EXPECT_EQ(ids.image_pad, 151655);
  const std::string prompt = tok.render_chat(R"({"messages": [{"role": "user", "content": [
      {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
      {"type": "text", "text": "What is this?"},
      {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}]}], "add_generation_prompt": true})");
  EXPECT_EQ(prompt,
            "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?"
            "<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n<|im_start|>assistant\n");
  const std::vector<int32_t> enc = tok.encode(prompt);
  ASSERT_EQ(count_image_pads(enc, ids), 2);
  // 448x448 -> grid 28x28 -> 196 tokens; 1920x1080 -> 1088x1920 -> grid 68x120 -> 2040 tokens.
  const auto full = expand_image_pads(enc, {patches(1, 28, 28), patches(1, 68, 120)}, ids, 2);
  EXPECT_EQ(full.size(), enc.size() + 195 + 2039);
  EXPECT_EQ(std::count(full.begin(), full.end(), ids.image_pad), 196 + 2040);
  std::string want = "<|im_start|>user\n<|vision_start|>";
  for (int i = 0; i < 196; ++i) want += "<|image_pad|>";
  want += "<|vision_end|>What is this?<|vision_start|>";
  EXPECT_EQ(tok.decode(full).substr(0, want.size()), want);
}
