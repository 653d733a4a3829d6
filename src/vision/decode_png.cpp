// PNG through libpng's progressive-free read API, with the transformations that make its output what PIL's
// PNG plugin gives: palette -> RGB(A), tRNS -> alpha, 1/2/4-bit grey scaled to 8 bits, 16-bit samples cut to
// their high byte (PIL's "RGB;16B" raw modes). No gamma or colour management (PIL applies none).
#include <png.h>

#include <chrono>
#include <csetjmp>
#include <cstring>

#include "vision/decode.h"

namespace kiln::vision::detail {
namespace {

struct PngSource {
  const uint8_t* data;
  size_t size, pos;
  char error[200];
  std::chrono::steady_clock::time_point deadline;
  bool timed_out;
};

// After each row libpng decodes: the only place a long decode can be stopped.
void png_on_row(png_structp png, png_uint_32, int) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (std::chrono::steady_clock::now() < src->deadline) return;
  src->timed_out = true;
  png_error(png, "time budget");
}

// The IDAT bytes the file holds (its chunk list walked; a broken list is left for libpng to report).
uint64_t png_idat_bytes(const uint8_t* data, size_t size) {
  uint64_t total = 0;
  for (size_t at = 8; at + 12 <= size;) {
    const uint32_t len = uint32_t(data[at]) << 24 | uint32_t(data[at + 1]) << 16 |
                         uint32_t(data[at + 2]) << 8 | uint32_t(data[at + 3]);
    if (std::memcmp(data + at + 4, "IDAT", 4) == 0) total += len;
    if (std::memcmp(data + at + 4, "IEND", 4) == 0 || len > size - at - 12) break;
    at += 12 + size_t(len);
  }
  return total;
}

// Deflate expands at most 1032:1 (a 258-byte match costs at least 2 bits), so a file whose image data is
// shorter than this cannot hold the declared image: refused before a pixel is allocated.
uint64_t png_idat_bytes_needed(uint64_t width, uint64_t height, int depth, int color) {
  const int samples = color == PNG_COLOR_TYPE_RGB_ALPHA    ? 4
                      : color == PNG_COLOR_TYPE_RGB        ? 3
                      : color == PNG_COLOR_TYPE_GRAY_ALPHA ? 2
                                                           : 1;
  const uint64_t row = 1 + (width * uint64_t(samples) * uint64_t(depth) + 7) / 8;  // filter byte + samples
  return row * height / 1032;
}

void png_read_mem(png_structp png, png_bytep out, size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->size - src->pos < n) png_error(png, "truncated data");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

void png_on_error(png_structp png, png_const_charp msg) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->error, sizeof src->error, "%s", msg);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}  // ancillary-chunk complaints; PIL ignores them too

enum class PngStep { ok, error, too_big, grey16, bad_size, too_little_data };

// No C++ object with a destructor lives in this frame: libpng leaves it by longjmp on any error.
PngStep png_decode_raw(PngSource* src, const ImageLimits* limits, DecodedImage* out,
                       std::vector<png_bytep>* rows) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, src, png_on_error, png_on_warning);
  if (!png) return PngStep::error;
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return PngStep::error;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return PngStep::error;
  }
  png_set_read_fn(png, src, png_read_mem);
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);  // our pixel limit below is the one that counts
  png_read_info(png, info);
  png_uint_32 w = 0, h = 0;
  int depth = 0, color = 0, interlace = 0;
  png_get_IHDR(png, info, &w, &h, &depth, &color, &interlace, nullptr, nullptr);
  out->width = static_cast<int>(w);
  out->height = static_cast<int>(h);
  if (w < 1 || h < 1) {
    png_destroy_read_struct(&png, &info, nullptr);
    return PngStep::bad_size;
  }
  if (static_cast<int64_t>(w) * static_cast<int64_t>(h) > limits->max_pixels) {
    png_destroy_read_struct(&png, &info, nullptr);
    return PngStep::too_big;
  }
  if (png_idat_bytes(src->data, src->size) < png_idat_bytes_needed(w, h, depth, color)) {
    png_destroy_read_struct(&png, &info, nullptr);
    return PngStep::too_little_data;
  }
  png_set_read_status_fn(png, png_on_row);
  const bool has_trns = png_get_valid(png, info, PNG_INFO_tRNS) != 0;
  if (depth == 16 && color == PNG_COLOR_TYPE_GRAY) {  // PIL opens it as "I;16", not as 8-bit grey
    png_destroy_read_struct(&png, &info, nullptr);
    return PngStep::grey16;
  }
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (has_trns) png_set_tRNS_to_alpha(png);
  if (depth == 16) png_set_strip_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  out->channels = png_get_channels(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  if (row_bytes != static_cast<size_t>(w) * static_cast<size_t>(out->channels))
    png_error(png, "unexpected row size");
  out->pixels.resize(row_bytes * h);
  rows->resize(h);
  for (png_uint_32 y = 0; y < h; ++y) (*rows)[y] = out->pixels.data() + y * row_bytes;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return PngStep::ok;
}

}  // namespace

DecodedImage decode_png(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  PngSource src{bytes.data(), bytes.size(), 0, {}, decode_deadline(limits), false};
  DecodedImage out;
  out.format = ImageFormat::png;
  std::vector<png_bytep> rows;
  switch (png_decode_raw(&src, &limits, &out, &rows)) {
    case PngStep::ok:
      return out;
    case PngStep::too_little_data:
      throw ImageError(ImageErrorKind::undecodable,
                       kiln::detail::concat("image: PNG declares ", out.width, "x", out.height,
                                            " but holds too little image data for that size"));
    case PngStep::too_big:
    case PngStep::bad_size:
      check_dimensions(out.width, out.height, limits, "PNG");
      break;
    case PngStep::grey16:
      throw ImageError(ImageErrorKind::unsupported_format, "image: 16-bit greyscale PNG is not supported");
    case PngStep::error:
      if (src.timed_out) throw_decode_timeout(limits, "PNG");
      break;
  }
  throw ImageError(ImageErrorKind::undecodable, std::string("image: PNG does not decode: ") +
                                                    (src.error[0] ? src.error : "libpng failed"));
}

}  // namespace kiln::vision::detail
