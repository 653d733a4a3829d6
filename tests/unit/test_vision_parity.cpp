// kiln's image preprocessing against transformers' (tests/fixtures/vision/references.json, written on the GPU
// machine by tests/fixtures/make_vl_pixel_fixture.py): the grid exactly; the resized 8-bit image and the
// pixel_values within a tolerance.
//
// Tolerance: the resize is integer arithmetic on both sides, but its weights come from doubles (the cubic's
// terms, the normalization by their sum, the scale), so a sum that lands within rounding of .5 can round the
// other way when any of those operations is ordered differently. Such a flip moves one sample by one 8-bit
// level, i.e. one pixel_values quantum 1 / (255 * std) (0.00784 for Qwen3-VL's std 0.5). Allowed: at most 1
// level anywhere, on at most 0.5 % of samples (torchvision's kernel) or 0.1 % (PIL's, which kiln matches bit
// for bit on Pillow 9.4 in development). Normalization itself is float32 in the same order as transformers:
// exact.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "unit/vision_test_util.h"
#include "vision/processor.h"

using namespace kiln::vision;
using kiln::vision_test::fixture_dir;
using kiln::vision_test::read_bytes;

namespace {

nlohmann::json load_references() {
  const auto bytes = read_bytes(fixture_dir() / "references.json");
  if (bytes.empty()) return nullptr;
  return nlohmann::json::parse(bytes.begin(), bytes.end());
}

ProcessorConfig case_config(const nlohmann::json& refs, const nlohmann::json& c) {
  ProcessorConfig cfg = parse_processor_config(refs["configs"][c["config"].get<std::string>()].dump());
  cfg.kernel = c["backend"] == "pil" ? ResampleKernel::pil : ResampleKernel::torchvision;
  return cfg;
}

#define SKIP_WITHOUT_REFERENCES(refs)                                                                  \
  if ((refs).is_null())                                                                                \
  GTEST_SKIP() << "tests/fixtures/vision/references.json is absent: the lead generates it on the GPU " \
                  "machine with tests/fixtures/make_vl_pixel_fixture.py (transformers, torch, torchvision)"

}  // namespace

TEST(VisionParity, GridsEqualTransformers) {
  const auto refs = load_references();
  SKIP_WITHOUT_REFERENCES(refs);
  int checked = 0;
  for (const auto& c : refs["cases"]) {
    SCOPED_TRACE(c["case"].get<std::string>());
    const RgbImage im = decode_rgb(read_bytes(fixture_dir() / "images" / c["image"].get<std::string>()), {});
    const ImagePatches p = preprocess_image(im, case_config(refs, c));
    const std::vector<int> grid = {p.grid_t, p.grid_h, p.grid_w};
    if (c.value("load_image", false)) {
      // transformers' load_image turned the EXIF-rotated image upright; kiln (like the processor on a PIL
      // image, vLLM and SGLang) does not: the grid is the transposed one.
      EXPECT_NE(grid, c["grid_thw"].get<std::vector<int>>());
      EXPECT_EQ((std::vector<int>{grid[0], grid[2], grid[1]}), c["grid_thw"].get<std::vector<int>>());
      continue;
    }
    EXPECT_EQ(grid, c["grid_thw"].get<std::vector<int>>());
    EXPECT_EQ(static_cast<int64_t>(p.patches()), c["shape"][0].get<int64_t>());
    EXPECT_EQ(p.patch_dim, c["shape"][1].get<int>());
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

TEST(VisionParity, PixelValuesMatchTransformers) {
  const auto refs = load_references();
  SKIP_WITHOUT_REFERENCES(refs);
  for (const auto& c : refs["cases"]) {
    if (c.value("load_image", false)) continue;
    const std::string name = c["case"];
    SCOPED_TRACE(name);
    const ProcessorConfig cfg = case_config(refs, c);
    const RgbImage im = decode_rgb(read_bytes(fixture_dir() / "images" / c["image"].get<std::string>()), {});
    const RgbImage mine = resize_for_processor(im, cfg);
    const RgbImage theirs = decode_rgb(read_bytes(fixture_dir() / "resized" / (name + ".png")), {});
    ASSERT_EQ(mine.width, theirs.width);
    ASSERT_EQ(mine.height, theirs.height);
    size_t off = 0;
    int worst = 0;
    for (size_t i = 0; i < mine.rgb.size(); ++i) {
      const int d = std::abs(mine.rgb[i] - theirs.rgb[i]);
      off += d != 0;
      worst = std::max(worst, d);
    }
    const double frac = static_cast<double>(off) / static_cast<double>(mine.rgb.size());
    EXPECT_LE(worst, 1);
    EXPECT_LE(frac, cfg.kernel == ResampleKernel::pil ? 0.001 : 0.005);
    std::printf("[ parity ] %-36s %4dx%-4d samples off by one level: %zu (%.3f %%)\n", name.c_str(),
                mine.width, mine.height, off, 100 * frac);

    const ImagePatches p = preprocess_image(im, cfg);
    const double quantum = 1.0 / (255.0 * cfg.image_std[0]);
    int bad = 0;
    for (const auto& s : c["samples"]) {
      const size_t at = s[0].get<size_t>() * static_cast<size_t>(p.patch_dim) + s[1].get<size_t>();
      ASSERT_LT(at, p.values.size());
      const double d = std::abs(static_cast<double>(p.values[at]) - s[2].get<double>());
      EXPECT_LE(d, quantum * 1.0001) << "row " << s[0] << " col " << s[1];
      bad += d > 0;
    }
    EXPECT_LE(bad, 3) << "samples that differ";
    double sum = 0, sum_sq = 0;
    for (float v : p.values) {
      sum += v;
      sum_sq += static_cast<double>(v) * v;
    }
    const double n = static_cast<double>(p.values.size());
    EXPECT_NEAR(sum, c["sum"].get<double>(), 0.005 * n * quantum);
    EXPECT_NEAR(sum_sq, c["sum_squares"].get<double>(), 0.01 * n * quantum);
  }
}

TEST(VisionParity, DefaultBackendIsTorchvision) {
  const auto refs = load_references();
  SKIP_WITHOUT_REFERENCES(refs);
  // What AutoImageProcessor gave for Qwen3-VL's preprocessor_config.json: kiln's default kernel must be that
  // one.
  const std::string cls = refs["auto_image_processor_default"];
  const ResampleKernel want = cls.ends_with("Pil") ? ResampleKernel::pil : ResampleKernel::torchvision;
  EXPECT_EQ(parse_processor_config(refs["configs"]["qwen3vl"].dump()).kernel, want) << cls;
}
