// Image decoding for Qwen3-VL inputs: PNG (libpng), JPEG (libjpeg-turbo) and WebP (libwebp), then to RGB
// exactly as transformers' image processors see a PIL image opened with Image.open (transformers 5.x's
// convert_to_rgb is PIL's convert("RGB"): grey replicated, alpha and tRNS transparency dropped, the stored
// colour kept; older transformers composited over white, and so does vLLM). EXIF orientation is NOT applied:
// transformers' processors do not apply it to a PIL image (only its load_image helper does), nor do vLLM's
// and SGLang's loaders. Every failure is an ImageError naming its kind, so the server can answer a 4xx.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/error.h"

namespace kiln::vision {

enum class ImageErrorKind {
  undecodable,         // corrupt, truncated or empty data
  unsupported_format,  // a format (or a variant: CMYK JPEG, animated WebP, 16-bit grey PNG) not handled
  too_many_bytes,      // the encoded image is larger than ImageLimits::max_bytes
  too_many_pixels,     // the declared width x height is larger than ImageLimits::max_pixels
  too_many_images,     // more images in one request than ImageLimits::max_images
  fetch_failed,        // an image URL could not be fetched (unreachable, timeout, HTTP error)
  bad_aspect_ratio,    // longer side / shorter side > 200 (transformers' smart_resize refuses it too)
  decode_timeout,      // decoding ran past ImageLimits::max_decode_seconds
};

class ImageError : public Error {
 public:
  ImageError(ImageErrorKind kind, const std::string& what) : Error(what), kind_(kind) {}
  ImageErrorKind kind() const { return kind_; }

 private:
  ImageErrorKind kind_;
};

const char* image_error_kind_name(ImageErrorKind kind);

struct ImageLimits {
  size_t max_bytes = 20u << 20;  // encoded bytes per image (OpenAI's per-image limit is 20 MB)
  int64_t max_pixels =
      89'478'485;       // decoded width x height (PIL's MAX_IMAGE_PIXELS), checked before decoding
  int max_images = 16;  // per request
  // Wall time one image's decode may take (JPEG and PNG decoders are stopped between rows when it runs out;
  // WebP's decoder is linear and fast). Whatever the data, decode work per image is bounded by this and by
  // max_pixels, which is checked against the header AND against the data actually there before anything
  // is allocated (a JPEG or PNG too short for the size it declares is refused).
  double max_decode_seconds = 10.0;
  // > 0: lowers the processor's max_pixels (what an image is resized to at most, so the vision tower's input;
  // its cost grows with the square of the patches) to this, as vLLM's --mm-processor-kwargs max_pixels does.
  // 0: the checkpoint's preprocessor_config.json (Qwen3-VL: 16,777,216), transformers' preprocessing exactly.
  int64_t max_resized_pixels = 0;
};

enum class ImageFormat { png, jpeg, webp };

// An 8-bit image, rows top to bottom, interleaved channels (1 grey, 2 grey+alpha, 3 RGB, 4 RGBA).
struct DecodedImage {
  int width = 0, height = 0, channels = 0;
  ImageFormat format = ImageFormat::png;
  std::vector<uint8_t> pixels;  // [height, width, channels]
};

// [height, width, 3] RGB.
struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// The format from the leading bytes; throws ImageError (unsupported_format, naming GIF/BMP/TIFF/... when
// recognised; undecodable when too short or unknown).
ImageFormat sniff_image_format(std::span<const uint8_t> bytes);

// Decodes as PIL's Image.open + load would (same libraries, no gamma or colour management). Throws
// ImageError: too_many_bytes before reading, too_many_pixels from the header before allocating,
// undecodable for corrupt or truncated data, unsupported_format for variants not handled.
DecodedImage decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits);

// transformers 5.x's convert_to_rgb (image_transforms.py), i.e. PIL's convert("RGB"): RGB kept, grey
// replicated, alpha dropped (a palette's or tRNS transparency too: libpng's expansion gave it as alpha).
RgbImage to_rgb(const DecodedImage& image);

// decode_image then to_rgb.
RgbImage decode_rgb(std::span<const uint8_t> bytes, const ImageLimits& limits);

namespace detail {
// Per-format decoders (decode_png.cpp, decode_jpeg.cpp, decode_webp.cpp); bytes are already size-checked.
DecodedImage decode_png(std::span<const uint8_t> bytes, const ImageLimits& limits);
DecodedImage decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits);
DecodedImage decode_webp(std::span<const uint8_t> bytes, const ImageLimits& limits);
// Throws too_many_pixels when width x height exceeds the limit, undecodable when either is < 1.
void check_dimensions(int64_t width, int64_t height, const ImageLimits& limits, const char* format);
// When a decode that starts now must stop (ImageLimits::max_decode_seconds), and the error it then throws.
std::chrono::steady_clock::time_point decode_deadline(const ImageLimits& limits);
[[noreturn]] void throw_decode_timeout(const ImageLimits& limits, const char* format);
}  // namespace detail

}  // namespace kiln::vision
