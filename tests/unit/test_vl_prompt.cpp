// Qwen3-VL prompt layout (model/qwen3_vl_prompt.h): M-RoPE positions as transformers' get_rope_index gives
// them (hand-derived here), the checks on images and pad tokens, and the prefix-cache keys.
#include <gtest/gtest.h>

#include "kiln/error.h"
#include "model/qwen3_vl_prompt.h"
#include "vl_test_util.h"

using namespace kiln;
using namespace kiln::test;

namespace {

TEST(VlPrompt, PositionsFollowGetRopeIndex) {
  const ModelConfig cfg = tiny_vl_config();
  // Image A: grid 1 x 4 x 6 -> merged 2 x 3 = 6 pads; image B: 1 x 2 x 2 -> 1 pad.
  const std::vector<vision::ImagePatches> imgs = {test_image(4, 6, 1), test_image(2, 2, 2)};
  const std::vector<int32_t> prompt = {
      7,         8,         kVisionStart, kImagePad, kImagePad,    kImagePad, kImagePad,
      kImagePad, kImagePad, kVisionEnd,   9,         kVisionStart, kImagePad, kVisionEnd};
  const VlPromptLayout L = layout_vl_prompt(cfg, prompt, imgs);
  // text 0 1 2 (vision_start at 2); image A at base 3: t = 3, h = 3 + row, w = 3 + col; then text resumes
  // at 3 + max(1, 2, 3) = 6: vision_end 6, 9 -> 7, vision_start 8; image B at base 9; vision_end 10.
  const std::vector<int32_t> t = {0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8, 9, 10};
  const std::vector<int32_t> h = {0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 8, 9, 10};
  const std::vector<int32_t> w = {0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 9, 10};
  for (size_t p = 0; p < prompt.size(); ++p) {
    EXPECT_EQ(L.position(int32_t(p), 0), t[p]) << p;
    EXPECT_EQ(L.position(int32_t(p), 1), h[p]) << p;
    EXPECT_EQ(L.position(int32_t(p), 2), w[p]) << p;
  }
  EXPECT_EQ(L.delta, 11 - 14);
  for (int a = 0; a < 3; ++a) EXPECT_EQ(L.position(14, a), 11) << "generation continues from the delta";
  ASSERT_EQ(L.spans.size(), 2u);
  EXPECT_EQ(L.spans[0].first_pad, 3);
  EXPECT_EQ(L.spans[0].count, 6);
  EXPECT_EQ(L.spans[1].first_pad, 12);
  EXPECT_EQ(L.spans[1].count, 1);
}

TEST(VlPrompt, BadImagesAndPadsAreRejected) {
  const ModelConfig cfg = tiny_vl_config();
  const std::vector<vision::ImagePatches> one = {test_image(4, 4, 1)};  // 4 pads
  auto fails = [&](const std::vector<int32_t>& prompt, const std::vector<vision::ImagePatches>& imgs,
                   const std::string& needle) {
    try {
      layout_vl_prompt(cfg, prompt, imgs);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << needle;
  };
  fails({1, kVisionStart, kImagePad, kImagePad, kImagePad, kVisionEnd}, one, "needs 4");
  fails({1, kVisionStart, kImagePad, kImagePad, kImagePad, kImagePad, kVisionEnd}, {}, "more image-pad runs");
  fails({1, 2, 3}, one, "1 images but the prompt has 0");
  fails({1, kImagePad, kImagePad, kImagePad, kImagePad}, one, "<|vision_start|>");
  fails({1, kVisionStart, kVideoPad, kVisionEnd}, {}, "video");
  vision::ImagePatches odd = test_image(4, 4, 1);
  odd.grid_h = 3;
  fails({1}, {odd}, "spatial_merge_size");
  vision::ImagePatches short_values = test_image(4, 4, 1);
  short_values.values.pop_back();
  fails({1}, {short_values}, "values");
  vision::ImagePatches dim = test_image(4, 4, 1);
  dim.patch_dim = 1536;
  fails({1}, {dim}, "patch_dim");
  ModelConfig text = cfg;
  text.has_vision = false;
  EXPECT_THROW(layout_vl_prompt(text, {1, 2}, one), Error);
  EXPECT_NO_THROW(layout_vl_prompt(text, {1, 2}, {}));
}

TEST(VlPrompt, CacheKeysSeparateImagesAndRepeatForTheSameOne) {
  const ModelConfig cfg = tiny_vl_config();
  const std::vector<vision::ImagePatches> a = {test_image(4, 4, 1)}, b = {test_image(4, 4, 2)};
  const std::vector<int32_t> prompt = vl_prompt(a, 5, 0);
  const auto ka = vl_cache_key(layout_vl_prompt(cfg, prompt, a), prompt, a);
  const auto ka2 = vl_cache_key(layout_vl_prompt(cfg, prompt, a), prompt, a);
  const auto kb = vl_cache_key(layout_vl_prompt(cfg, prompt, b), prompt, b);
  EXPECT_EQ(ka, ka2);
  ASSERT_EQ(ka.size(), prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) {
    const bool image_token = prompt[i] == kVisionStart || prompt[i] == kImagePad;
    if (!image_token) {
      EXPECT_EQ(ka[i], prompt[i]);
      EXPECT_EQ(kb[i], prompt[i]);
    } else {
      EXPECT_LT(ka[i], 0) << "image keys are never token ids";
      EXPECT_NE(ka[i], kb[i]) << i;
    }
  }
}

}  // namespace
