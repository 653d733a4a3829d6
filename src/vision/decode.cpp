#include "vision/decode.h"

#include <algorithm>
#include <cstring>

namespace kiln::vision {

const char* image_error_kind_name(ImageErrorKind kind) {
  switch (kind) {
    case ImageErrorKind::undecodable:
      return "undecodable";
    case ImageErrorKind::unsupported_format:
      return "unsupported_format";
    case ImageErrorKind::too_many_bytes:
      return "too_many_bytes";
    case ImageErrorKind::too_many_pixels:
      return "too_many_pixels";
    case ImageErrorKind::too_many_images:
      return "too_many_images";
    case ImageErrorKind::fetch_failed:
      return "fetch_failed";
    case ImageErrorKind::bad_aspect_ratio:
      return "bad_aspect_ratio";
    case ImageErrorKind::decode_timeout:
      return "decode_timeout";
  }
  return "unknown";
}

namespace {

bool starts_with(std::span<const uint8_t> b, const char* magic, size_t at = 0) {
  size_t n = std::strlen(magic);
  return b.size() >= at + n && std::memcmp(b.data() + at, magic, n) == 0;
}

}  // namespace

ImageFormat sniff_image_format(std::span<const uint8_t> b) {
  if (b.empty()) throw ImageError(ImageErrorKind::undecodable, "image: empty data");
  if (starts_with(b, "\x89PNG\r\n\x1a\n")) return ImageFormat::png;
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::jpeg;
  if (starts_with(b, "RIFF") && starts_with(b, "WEBP", 8)) return ImageFormat::webp;
  const char* other = nullptr;
  if (starts_with(b, "GIF87a") || starts_with(b, "GIF89a"))
    other = "GIF";
  else if (starts_with(b, "BM"))
    other = "BMP";
  else if (starts_with(b, "II*") || starts_with(b, "MM"))
    other = "TIFF";
  else if (starts_with(b, "ftyp", 4))
    other = "HEIF/AVIF";
  else if (starts_with(b, "<svg") || starts_with(b, "<?xml"))
    other = "SVG";
  if (other)
    throw ImageError(ImageErrorKind::unsupported_format, std::string("image: unsupported format ") + other +
                                                             " (PNG, JPEG and WebP are accepted)");
  throw ImageError(ImageErrorKind::undecodable,
                   "image: not a PNG, JPEG or WebP image (unrecognised leading bytes)");
}

namespace detail {
void check_dimensions(int64_t width, int64_t height, const ImageLimits& limits, const char* format) {
  if (width < 1 || height < 1)
    throw ImageError(ImageErrorKind::undecodable,
                     kiln::detail::concat("image: ", format, " declares a ", width, "x", height, " image"));
  if (width * height > limits.max_pixels)
    throw ImageError(ImageErrorKind::too_many_pixels,
                     kiln::detail::concat("image: ", width, "x", height, " = ", width * height,
                                          " pixels exceeds the limit of ", limits.max_pixels, " pixels"));
}

std::chrono::steady_clock::time_point decode_deadline(const ImageLimits& limits) {
  const double s = std::clamp(limits.max_decode_seconds, 0.0, 86400.0);
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

void throw_decode_timeout(const ImageLimits& limits, const char* format) {
  throw ImageError(ImageErrorKind::decode_timeout,
                   kiln::detail::concat("image: decoding the ", format, " took longer than the limit of ",
                                        limits.max_decode_seconds, " s"));
}
}  // namespace detail

DecodedImage decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  if (bytes.size() > limits.max_bytes)
    throw ImageError(ImageErrorKind::too_many_bytes,
                     kiln::detail::concat("image: ", bytes.size(), " bytes exceeds the limit of ",
                                          limits.max_bytes, " bytes"));
  switch (sniff_image_format(bytes)) {
    case ImageFormat::png:
      return detail::decode_png(bytes, limits);
    case ImageFormat::jpeg:
      return detail::decode_jpeg(bytes, limits);
    case ImageFormat::webp:
      return detail::decode_webp(bytes, limits);
  }
  throw ImageError(ImageErrorKind::undecodable, "image: unknown format");
}

RgbImage to_rgb(const DecodedImage& im) {
  KILN_CHECK(im.channels >= 1 && im.channels <= 4, "channels ", im.channels);
  const size_t n = static_cast<size_t>(im.width) * static_cast<size_t>(im.height);
  KILN_CHECK_EQ(im.pixels.size(), n * static_cast<size_t>(im.channels));
  RgbImage out{im.width, im.height, std::vector<uint8_t>(n * 3)};
  const uint8_t* p = im.pixels.data();
  uint8_t* o = out.rgb.data();
  switch (im.channels) {
    case 3:
      std::memcpy(o, p, n * 3);
      break;
    case 1:  // L -> RGB: the grey value replicated
      for (size_t i = 0; i < n; ++i) o[3 * i] = o[3 * i + 1] = o[3 * i + 2] = p[i];
      break;
    case 2:  // LA -> RGB: the grey value, alpha dropped
      for (size_t i = 0; i < n; ++i) o[3 * i] = o[3 * i + 1] = o[3 * i + 2] = p[2 * i];
      break;
    case 4:  // RGBA -> RGB: alpha dropped, the stored colour kept (what PIL's convert("RGB") does)
      for (size_t i = 0; i < n; ++i)
        for (int c = 0; c < 3; ++c) o[3 * i + c] = p[4 * i + c];
      break;
  }
  return out;
}

RgbImage decode_rgb(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  return to_rgb(decode_image(bytes, limits));
}

}  // namespace kiln::vision
