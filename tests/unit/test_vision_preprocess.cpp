// src/vision's image processor: smart_resize (transformers' arithmetic, Python's ties-to-even round),
// preprocessor_config.json parsing, the patch row order, normalization and the content hash.
#include <gtest/gtest.h>

#include "common/test_support.h"
#include "vision/processor.h"

using namespace kiln::vision;

namespace {
constexpr const char* kQwen3VlConfig = R"({
  "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
  "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
  "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"})";

RgbImage coordinate_image(int w, int h) {  // R = x, G = y, B = x ^ y: every pixel names where it came from
  RgbImage im{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &im.rgb[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>(x);
      p[1] = static_cast<uint8_t>(y);
      p[2] = static_cast<uint8_t>(x ^ y);
    }
  return im;
}
}  // namespace

TEST(VisionProcessor, SmartResizeAsTransformers) {
  // Values from transformers' smart_resize formula run in Python (factor 32).
  using A = std::array<int, 2>;
  EXPECT_EQ(smart_resize(1080, 1920, 32, 65536, 16777216), (A{1088, 1920}));
  EXPECT_EQ(smart_resize(448, 448, 32, 65536, 16777216), (A{448, 448}));
  EXPECT_EQ(smart_resize(1024, 1024, 32, 65536, 16777216), (A{1024, 1024}));
  EXPECT_EQ(smart_resize(10, 10, 32, 65536, 16777216), (A{256, 256}));  // min_pixels: ceil branch
  EXPECT_EQ(smart_resize(48, 80, 32, 1024, 1 << 24), (A{64, 64}));      // 1.5 and 2.5 both round to 2 (even)
  EXPECT_EQ(smart_resize(112, 144, 32, 1024, 1 << 24), (A{128, 128}));  // 3.5 -> 4, 4.5 -> 4
  // max_pixels: floor branch. 151x133 with max 16384: beta = sqrt(20083/16384); floor(136.4/32) = 4, 120.1
  // -> 3.
  EXPECT_EQ(smart_resize(151, 133, 32, 1024, 16384), (A{128, 96}));
  EXPECT_EQ(smart_resize(4000, 30, 32, 1024, 16384), (A{1472, 32}));  // never below one factor
  try {
    smart_resize(1, 201, 32, 1024, 16384);
    ADD_FAILURE() << "no error";
  } catch (const ImageError& e) {
    EXPECT_EQ(e.kind(), ImageErrorKind::bad_aspect_ratio);
  }
  EXPECT_EQ(smart_resize(1, 200, 32, 1024, 16384), (A{32, 480}));  // 200:1 is allowed
}

TEST(VisionProcessor, ParsesPreprocessorConfig) {
  const ProcessorConfig c = parse_processor_config(kQwen3VlConfig);
  EXPECT_EQ(c.patch_size, 16);
  EXPECT_EQ(c.merge_size, 2);
  EXPECT_EQ(c.temporal_patch_size, 2);
  EXPECT_EQ(c.min_pixels, 65536);
  EXPECT_EQ(c.max_pixels, 16777216);
  EXPECT_EQ(c.image_mean[1], 0.5);
  EXPECT_EQ(c.patch_dim(), 1536);
  EXPECT_EQ(c.kernel, ResampleKernel::torchvision);
  // The class defaults when the file says nothing; min_pixels/max_pixels override size.
  const ProcessorConfig d = parse_processor_config(R"({"min_pixels": 100, "max_pixels": 200})");
  EXPECT_EQ(d.patch_size, 14);
  EXPECT_EQ(d.min_pixels, 100);
  EXPECT_EQ(d.max_pixels, 200);
  EXPECT_EQ(parse_processor_config(R"({"image_processor_type": "Qwen2VLImageProcessorPil"})").kernel,
            ResampleKernel::pil);
  using kiln::test_support::error_of;
  using kiln::test_support::expect_contains;
  expect_contains(error_of([] { parse_processor_config(R"({"resample": 2})"); }), {"resample"});
  expect_contains(error_of([] { parse_processor_config(R"({"size": {"shortest_edge": 5}})"); }),
                  {"longest_edge"});
  expect_contains(error_of([] { parse_processor_config(R"({"patch_size": 0})"); }), {"patch_size"});
  expect_contains(error_of([] { parse_processor_config("[1]"); }), {"object"});
  expect_contains(error_of([] { parse_processor_config("{"); }), {"not JSON"});
  expect_contains(error_of([] { parse_processor_config(R"({"do_convert_rgb": false})"); }),
                  {"do_convert_rgb"});
}

TEST(VisionProcessor, PatchRowsInProcessorOrder) {
  ProcessorConfig c = parse_processor_config(kQwen3VlConfig);
  c.min_pixels = 1024;  // 64x96 is already a multiple of 32 within the limits: no resize
  const RgbImage im = coordinate_image(96, 64);
  const ImagePatches p = preprocess_image(im, c);
  ASSERT_EQ(p.grid_t, 1);
  ASSERT_EQ(p.grid_h, 4);
  ASSERT_EQ(p.grid_w, 6);
  ASSERT_EQ(p.patch_dim, 1536);
  ASSERT_EQ(p.values.size(), size_t{24} * 1536);
  EXPECT_EQ(p.merged_tokens(2), 6);
  // Row r = ((bh * (gw/2) + bw) * 2 + mh) * 2 + mw; column = ((ch * 2 + t) * 16 + py) * 16 + px.
  for (int r = 0; r < 24; ++r) {
    const int mw = r % 2, mh = (r / 2) % 2, bw = (r / 4) % 3, bh = r / 12;
    for (int col = 0; col < 1536; col += 37) {
      const int px = col % 16, py = (col / 16) % 16, ch = col / 512;
      const int x = (bw * 2 + mw) * 16 + px, y = (bh * 2 + mh) * 16 + py;
      const int v = ch == 0 ? x : ch == 1 ? y : (x ^ y);
      const float want = (static_cast<float>(v) - 127.5f) / 127.5f;
      ASSERT_EQ(p.values[static_cast<size_t>(r) * 1536 + col], want) << r << " " << col;
    }
  }
  // The two temporal frames of a still image are equal.
  for (int col = 0; col < 256; ++col) EXPECT_EQ(p.values[col], p.values[256 + col]);
}

TEST(VisionProcessor, ContentHashSeesPixelsAndSize) {
  const RgbImage a = coordinate_image(32, 32);
  RgbImage b = a;
  EXPECT_EQ(image_content_hash(a), image_content_hash(b));
  b.rgb[100] ^= 1;
  EXPECT_NE(image_content_hash(a), image_content_hash(b));
  // Same bytes, other shape.
  RgbImage c{16, 64, a.rgb};
  EXPECT_NE(image_content_hash(a), image_content_hash(c));
  const ImagePatches p = preprocess_image(a, parse_processor_config(kQwen3VlConfig));
  EXPECT_EQ(p.content_hash, image_content_hash(a));
  EXPECT_NE(p.content_hash[0] | p.content_hash[1], 0u);
}

TEST(VisionProcessor, UpscalesSmallImagesToMinPixels) {
  const ImagePatches p = preprocess_image(coordinate_image(37, 53), parse_processor_config(kQwen3VlConfig));
  // smart_resize(53, 37): round -> 64 x 32 = 2048 < 65536; beta = sqrt(65536 / 1961) = 5.781; 306.4 -> 320,
  // 213.9 -> 224.
  EXPECT_EQ(p.grid_h, 20);
  EXPECT_EQ(p.grid_w, 14);
  for (float v : p.values) ASSERT_TRUE(v >= -1.0f && v <= 1.0f);
}
