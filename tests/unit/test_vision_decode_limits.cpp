// Image bombs against the decoders' budgets (ImageLimits): a file whose header declares far more pixels than
// its data can hold is refused before any pixel is allocated, scan data that ends before the declared image
// does is an error (not a grey fill), and a decode is stopped once its time budget is spent. Every bomb is
// made here from a committed fixture or from nothing, a few KB each.
#include <gtest/gtest.h>
#include <zlib.h>

#include <string>

#include "unit/vision_test_util.h"
#include "vision/decode.h"
#include "vision/processor.h"

using namespace kiln::vision;
using kiln::vision_test::fixture_dir;
using kiln::vision_test::read_bytes;

namespace {

ImageError error_of(const std::vector<uint8_t>& bytes, const ImageLimits& limits = {}) {
  try {
    decode_rgb(bytes, limits);
  } catch (const ImageError& e) {
    return e;
  }
  ADD_FAILURE() << "decoded without an ImageError";
  return ImageError(ImageErrorKind::fetch_failed, "none");
}

// photo.jpg (83 x 61, 3,775 bytes: the file) with its frame header claiming width x height.
std::vector<uint8_t> jpeg_claiming(int width, int height) {
  auto jpeg = read_bytes(fixture_dir() / "images/photo.jpg");
  for (size_t i = 2; i + 9 < jpeg.size(); ++i)
    if (jpeg[i] == 0xFF && (jpeg[i + 1] == 0xC0 || jpeg[i + 1] == 0xC2)) {
      jpeg[i + 5] = uint8_t(height >> 8), jpeg[i + 6] = uint8_t(height);
      jpeg[i + 7] = uint8_t(width >> 8), jpeg[i + 8] = uint8_t(width);
      return jpeg;
    }
  ADD_FAILURE() << "no frame header in photo.jpg";
  return jpeg;
}

void put_chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& data) {
  const uint32_t n = uint32_t(data.size());
  for (int i = 3; i >= 0; --i) out.push_back(uint8_t(n >> (8 * i)));
  const size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  const uint32_t crc = uint32_t(crc32(0, out.data() + start, uInt(out.size() - start)));
  for (int i = 3; i >= 0; --i) out.push_back(uint8_t(crc >> (8 * i)));
}

// An 8-bit RGB PNG of width x height whose IDAT is `rows` all-zero rows, deflated at level 9.
std::vector<uint8_t> zero_png(uint32_t width, uint32_t height, uint32_t rows) {
  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  for (uint32_t v : {width, height})
    for (int i = 3; i >= 0; --i) ihdr.push_back(uint8_t(v >> (8 * i)));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});
  put_chunk(out, "IHDR", ihdr);
  const std::vector<uint8_t> raw(size_t(rows) * (1 + 3 * size_t(width)), 0);
  uLongf n = compressBound(uLong(raw.size()));
  std::vector<uint8_t> z(n);
  EXPECT_EQ(compress2(z.data(), &n, raw.data(), uLong(raw.size()), 9), Z_OK);
  z.resize(n);
  put_chunk(out, "IDAT", z);
  put_chunk(out, "IEND", {});
  return out;
}

}  // namespace

TEST(VisionDecodeLimits, AJpegDeclaringFarMorePixelsThanItsDataHoldsIsRefusedBeforeDecoding) {
  // 9000 x 9000 = 81 M pixels, under the 89 M pixel limit: only the data's size gives it away.
  const ImageError e = error_of(jpeg_claiming(9000, 9000));
  EXPECT_EQ(e.kind(), ImageErrorKind::undecodable);
  EXPECT_NE(std::string(e.what()).find("9000x9000"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("3775 bytes"), std::string::npos) << e.what();
}

TEST(VisionDecodeLimits, JpegScanDataEndingBeforeTheDeclaredImageIsAnError) {
  // 400 x 400 passes the size bound, but the scan data covers 83 x 61 and then meets the end marker: libjpeg
  // would fill the rest with grey.
  const ImageError e = error_of(jpeg_claiming(400, 400));
  EXPECT_EQ(e.kind(), ImageErrorKind::undecodable);
  EXPECT_EQ(decode_rgb(jpeg_claiming(83, 61), {}).width, 83);  // the patch itself changes nothing else
}

TEST(VisionDecodeLimits, APngDeclaringFarMorePixelsThanItsDataHoldsIsRefusedBeforeDecoding) {
  // 9000 x 9000 RGB would inflate to 243 MB; its 16 rows of data are a few bytes.
  const ImageError e = error_of(zero_png(9000, 9000, 16));
  EXPECT_EQ(e.kind(), ImageErrorKind::undecodable);
  EXPECT_NE(std::string(e.what()).find("too little image data"), std::string::npos) << e.what();
}

TEST(VisionDecodeLimits, AnAllZeroPngIsAnImageLikeAnyOther) {
  // The 2048 x 2048 all-zero PNG (about 12 KB): legitimate, decoded, its cost linear in its pixels.
  const std::vector<uint8_t> png = zero_png(2048, 2048, 2048);
  EXPECT_LT(png.size(), 16u * 1024);
  const RgbImage rgb = decode_rgb(png, {});
  EXPECT_EQ(rgb.width, 2048);
  EXPECT_EQ(rgb.height, 2048);
  EXPECT_EQ(rgb.rgb[12345], 0);
}

TEST(VisionDecodeLimits, ADecodeStopsWhenItsTimeBudgetIsSpent) {
  ImageLimits none;
  none.max_decode_seconds = 0;  // spent before the first row
  for (const char* name : {"photo.jpg", "odd_rgb.png", "grey.jpg", "palette_trns.png"}) {
    const ImageError e = error_of(read_bytes(fixture_dir() / "images" / name), none);
    EXPECT_EQ(e.kind(), ImageErrorKind::decode_timeout) << name;
    EXPECT_NE(std::string(e.what()).find("limit of 0 s"), std::string::npos) << e.what();
  }
  EXPECT_EQ(decode_rgb(read_bytes(fixture_dir() / "images/photo.jpg"), {}).width, 83);  // the default: 10 s
}

TEST(VisionDecodeLimits, TheProcessorsMaxPixelsBoundsTheVisionTowersInput) {
  // Qwen3-VL: longest_edge 16,777,216 pixels = 65,536 patches of 16 x 16 at most, whatever the image.
  ProcessorConfig c;
  c.patch_size = 16;
  c.min_pixels = 65536;
  c.max_pixels = 1 << 20;  // a smaller cap, as a checkpoint may set
  RgbImage big{3000, 2000, std::vector<uint8_t>(3000u * 2000u * 3u, 7)};
  const ImagePatches p = preprocess_image(big, c);
  EXPECT_LE(int64_t(p.patches()) * 16 * 16, c.max_pixels);
  EXPECT_GT(int64_t(p.patches()) * 16 * 16, c.max_pixels / 2);
}
