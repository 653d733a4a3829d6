// JPEG through libjpeg-turbo with its defaults (islow DCT, fancy upsampling): what PIL's JPEG plugin asks of
// the same library. A JPEG that ends early is an error, as in PIL ("image file is truncated"), not the grey
// fill libjpeg would supply.
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <cstring>

#include <jerror.h>
#include <jpeglib.h>

#include "vision/decode.h"

namespace kiln::vision::detail {
namespace {

struct JpegErrors {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrors*>(cinfo->err);
  cinfo->err->format_message(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_on_error(cinfo);  // truncated
}

enum class JpegStep { ok, error, too_big, bad_size, cmyk };

// No C++ object with a destructor lives in this frame: libjpeg leaves it by longjmp on any error.
JpegStep jpeg_decode_raw(std::span<const uint8_t> bytes, const ImageLimits* limits, JpegErrors* err,
                         DecodedImage* out) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->pub);
  err->pub.error_exit = jpeg_on_error;
  err->pub.emit_message = jpeg_on_message;
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return JpegStep::error;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  out->width = static_cast<int>(cinfo.image_width);
  out->height = static_cast<int>(cinfo.image_height);
  JpegStep early = JpegStep::ok;
  if (out->width < 1 || out->height < 1)
    early = JpegStep::bad_size;
  else if (static_cast<int64_t>(out->width) * out->height > limits->max_pixels)
    early = JpegStep::too_big;
  else if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK)
    early = JpegStep::cmyk;
  if (early != JpegStep::ok) {
    jpeg_destroy_decompress(&cinfo);
    return early;
  }
  const bool grey = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  cinfo.out_color_space = grey ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  out->channels = cinfo.output_components;
  const size_t row_bytes = static_cast<size_t>(cinfo.output_width) * static_cast<size_t>(out->channels);
  out->pixels.resize(row_bytes * cinfo.output_height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->pixels.data() + cinfo.output_scanline * row_bytes;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return JpegStep::ok;
}

}  // namespace

DecodedImage decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  JpegErrors err{};
  DecodedImage out;
  out.format = ImageFormat::jpeg;
  switch (jpeg_decode_raw(bytes, &limits, &err, &out)) {
    case JpegStep::ok:
      return out;
    case JpegStep::too_big:
    case JpegStep::bad_size:
      check_dimensions(out.width, out.height, limits, "JPEG");
      break;
    case JpegStep::cmyk:
      throw ImageError(ImageErrorKind::unsupported_format, "image: CMYK/YCCK JPEG is not supported");
    case JpegStep::error:
      break;
  }
  const bool truncated = err.pub.msg_code == JWRN_JPEG_EOF;
  throw ImageError(ImageErrorKind::undecodable, std::string("image: JPEG does not decode: ") +
                                                    (truncated ? "truncated data" : err.message));
}

}  // namespace kiln::vision::detail
