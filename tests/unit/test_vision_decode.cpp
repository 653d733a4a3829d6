// src/vision decoding: every committed test image decodes to what PIL's Image.open + transformers'
// convert_to_rgb gave (tests/fixtures/vision/decoded, written by make_vl_pixel_fixture.py), and bad input
// gets the ImageError kind the server maps to its 4xx.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "unit/vision_test_util.h"
#include "vision/decode.h"

using namespace kiln::vision;
using kiln::vision_test::fixture_dir;
using kiln::vision_test::read_bytes;

namespace {

const char* kImages[] = {"odd_rgb.png",      "photo.jpg",    "wide.webp", "big_odd.png",
                         "grey.png",         "grey.jpg",     "rgba.png",  "rgba_lossless.webp",
                         "palette_trns.png", "exif_rot6.jpg"};

ImageErrorKind kind_of(const std::vector<uint8_t>& bytes, const ImageLimits& limits = {}) {
  try {
    decode_rgb(bytes, limits);
  } catch (const ImageError& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no ImageError";
  return ImageErrorKind::fetch_failed;
}

bool is_jpeg(const std::string& name) {
  return name.ends_with(".jpg");
}

// A PNG chunk with its CRC.
void put_chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& data) {
  const uint32_t n = static_cast<uint32_t>(data.size());
  for (int i = 3; i >= 0; --i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  const size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  const uint32_t crc =
      static_cast<uint32_t>(crc32(0, out.data() + start, static_cast<uInt>(out.size() - start)));
  for (int i = 3; i >= 0; --i) out.push_back(static_cast<uint8_t>(crc >> (8 * i)));
}

std::vector<uint8_t> png_header_only(uint32_t w, uint32_t h) {
  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  for (uint32_t v : {w, h})
    for (int i = 3; i >= 0; --i) ihdr.push_back(static_cast<uint8_t>(v >> (8 * i)));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit RGB
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", {0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01});
  put_chunk(out, "IEND", {});
  return out;
}

}  // namespace

TEST(VisionDecode, MatchesPilOnEveryFixtureImage) {
  for (const char* name : kImages) {
    SCOPED_TRACE(name);
    const auto bytes = read_bytes(fixture_dir() / "images" / name);
    ASSERT_FALSE(bytes.empty()) << "missing fixture image (run tests/fixtures/make_vl_pixel_fixture.py)";
    const RgbImage got = decode_rgb(bytes, {});
    const RgbImage want =
        decode_rgb(read_bytes(fixture_dir() / "decoded" / (std::string(name) + ".png")), {});
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    int max_diff = 0;
    for (size_t i = 0; i < got.rgb.size(); ++i)
      max_diff = std::max(max_diff, std::abs(got.rgb[i] - want.rgb[i]));
    // PNG and WebP are exact; JPEG may differ by one level where PIL's bundled libjpeg-turbo is another
    // release than Debian's (the islow IDCT is exact across releases; the colour conversion tables may not
    // be).
    EXPECT_LE(max_diff, is_jpeg(name) ? 1 : 0);
  }
}

TEST(VisionDecode, ExifOrientationIsNotApplied) {
  // 72x40 stored, orientation 6 (a viewer shows it 40x72): the processor sees the stored pixels.
  const RgbImage im = decode_rgb(read_bytes(fixture_dir() / "images/exif_rot6.jpg"), {});
  EXPECT_EQ(im.width, 72);
  EXPECT_EQ(im.height, 40);
}

TEST(VisionDecode, ChannelsBeforeRgb) {
  EXPECT_EQ(decode_image(read_bytes(fixture_dir() / "images/grey.png"), {}).channels, 1);
  EXPECT_EQ(decode_image(read_bytes(fixture_dir() / "images/grey.jpg"), {}).channels, 1);
  EXPECT_EQ(decode_image(read_bytes(fixture_dir() / "images/rgba.png"), {}).channels, 4);
  EXPECT_EQ(decode_image(read_bytes(fixture_dir() / "images/palette_trns.png"), {}).channels, 4);
  EXPECT_EQ(decode_image(read_bytes(fixture_dir() / "images/rgba_lossless.webp"), {}).channels, 4);
  EXPECT_EQ(decode_image(read_bytes(fixture_dir() / "images/photo.jpg"), {}).channels, 3);
}

TEST(VisionDecode, AlphaIsDropped) {
  // transformers 5.x's convert_to_rgb is PIL's convert("RGB"): the stored colour, whatever the alpha.
  for (uint8_t alpha : {0, 1, 128, 255}) {
    const RgbImage rgb = to_rgb(DecodedImage{1, 1, 4, ImageFormat::png, {10, 20, 30, alpha}});
    EXPECT_EQ(rgb.rgb, (std::vector<uint8_t>{10, 20, 30})) << int(alpha);
    EXPECT_EQ(to_rgb(DecodedImage{1, 1, 2, ImageFormat::png, {77, alpha}}).rgb,
              (std::vector<uint8_t>{77, 77, 77}));
  }
}

TEST(VisionDecode, TruncatedImagesAreUndecodable) {
  for (const char* name : kImages) {
    SCOPED_TRACE(name);
    auto bytes = read_bytes(fixture_dir() / "images" / name);
    for (size_t keep : {bytes.size() / 2, bytes.size() - 20, size_t{12}, size_t{3}}) {
      std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<long>(keep));
      EXPECT_EQ(kind_of(cut), ImageErrorKind::undecodable) << keep;
    }
  }
}

TEST(VisionDecode, GarbageAndOtherFormats) {
  EXPECT_EQ(kind_of({}), ImageErrorKind::undecodable);
  EXPECT_EQ(kind_of({'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'}), ImageErrorKind::undecodable);
  const std::string gif = "GIF89a\x01\x00\x01\x00";
  EXPECT_EQ(kind_of({gif.begin(), gif.end()}), ImageErrorKind::unsupported_format);
  const std::string bmp = "BM\x3a\x00\x00\x00";
  EXPECT_EQ(kind_of({bmp.begin(), bmp.end()}), ImageErrorKind::unsupported_format);
  try {
    decode_rgb(std::vector<uint8_t>(gif.begin(), gif.end()), {});
  } catch (const ImageError& e) {
    EXPECT_NE(std::string(e.what()).find("GIF"), std::string::npos) << e.what();
  }
  // A PNG whose chunks are corrupted after the header.
  auto png = read_bytes(fixture_dir() / "images/odd_rgb.png");
  for (size_t i = 40; i < png.size() - 12; i += 7) png[i] ^= 0x5a;
  EXPECT_EQ(kind_of(png), ImageErrorKind::undecodable);
}

TEST(VisionDecode, ByteAndPixelLimits) {
  const auto photo = read_bytes(fixture_dir() / "images/photo.jpg");
  ImageLimits small_bytes;
  small_bytes.max_bytes = photo.size() - 1;
  EXPECT_EQ(kind_of(photo, small_bytes), ImageErrorKind::too_many_bytes);
  ImageLimits small_pixels;
  small_pixels.max_pixels = 83 * 61 - 1;
  EXPECT_EQ(kind_of(photo, small_pixels), ImageErrorKind::too_many_pixels);
  small_pixels.max_pixels = 83 * 61;
  EXPECT_EQ(decode_rgb(photo, small_pixels).width, 83);
  for (const char* name : {"odd_rgb.png", "wide.webp"}) {
    ImageLimits one;
    one.max_pixels = 1;
    EXPECT_EQ(kind_of(read_bytes(fixture_dir() / "images" / name), one), ImageErrorKind::too_many_pixels)
        << name;
  }
}

TEST(VisionDecode, HugeDeclaredDimensionsFailBeforeAllocating) {
  // 100000 x 100000 RGB would be 30 GB: refused from the header.
  EXPECT_EQ(kind_of(png_header_only(100000, 100000)), ImageErrorKind::too_many_pixels);
  EXPECT_EQ(kind_of(png_header_only(0, 10)), ImageErrorKind::undecodable);
  // A JPEG whose frame header claims 65000 x 65000.
  auto jpeg = read_bytes(fixture_dir() / "images/photo.jpg");
  bool patched = false;
  for (size_t i = 2; i + 9 < jpeg.size(); ++i)
    if (jpeg[i] == 0xFF && (jpeg[i + 1] == 0xC0 || jpeg[i + 1] == 0xC2)) {
      jpeg[i + 5] = jpeg[i + 7] = 0xFD;
      jpeg[i + 6] = jpeg[i + 8] = 0xE8;
      patched = true;
      break;
    }
  ASSERT_TRUE(patched);
  EXPECT_EQ(kind_of(jpeg), ImageErrorKind::too_many_pixels);
  // A WebP whose VP8L header claims 16384 x 16384 (the format's maximum) in a 30-byte file.
  std::vector<uint8_t> webp = {'R',  'I',  'F',  'F',  22,   0,    0,    0,    'W',  'E',
                               'B',  'P',  'V',  'P',  '8',  'L',  10,   0,    0,    0,
                               0x2f, 0xff, 0xff, 0xff, 0x0f, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(kind_of(webp), ImageErrorKind::too_many_pixels);
}
