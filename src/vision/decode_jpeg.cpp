// JPEG through libjpeg-turbo with its defaults (islow DCT, fancy upsampling): what PIL's JPEG plugin asks of
// the same library. A JPEG that ends early is an error, as in PIL ("image file is truncated"), not the grey
// fill libjpeg would supply.
#include <algorithm>
#include <chrono>
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <cstring>

#include <jerror.h>
#include <jpeglib.h>

#include "vision/decode.h"

namespace kiln::vision::detail {
namespace {

// How a decode may be told to stop (from the error or the progress callback, by longjmp).
enum class JpegStop { none, time_budget, too_many_scans };

// A progressive JPEG may hold any number of scans, each a pass over the whole image (libjpeg-turbo's
// djpeg -maxscans advice: a few hundred at most; real encoders write about 10).
constexpr int kMaxJpegScans = 500;

struct JpegErrors {
  jpeg_error_mgr pub;
  jpeg_progress_mgr progress;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  std::chrono::steady_clock::time_point deadline;
  JpegStop stop;
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrors*>(cinfo->err);
  cinfo->err->format_message(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings that mean the scan data does not cover the image the header declares (truncated data, a marker
// where entropy-coded data should be, scans out of order): libjpeg would fill the rest with grey, which is
// how a few KB could declare a 9000x9000 image. PIL calls such data truncated or broken; so do we.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level != -1) return;
  switch (cinfo->err->msg_code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_MUST_RESYNC:
    case JWRN_NOT_SEQUENTIAL:
      jpeg_on_error(cinfo);
      break;
    default:
      break;
  }
}

// Called by libjpeg between rows of MCUs, also inside jpeg_start_decompress's pass over a progressive
// image's scans: the only place a long decode can be stopped.
void jpeg_on_progress(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrors*>(cinfo->err);
  const auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->input_scan_number > kMaxJpegScans)
    err->stop = JpegStop::too_many_scans;
  else if (std::chrono::steady_clock::now() >= err->deadline)
    err->stop = JpegStop::time_budget;
  if (err->stop != JpegStop::none) std::longjmp(err->jump, 1);
}

enum class JpegStep { ok, error, too_big, bad_size, cmyk, too_little_data };

// A lower bound on the bytes a Huffman-coded JPEG of this size holds: every block of a component that any
// scan codes costs at least one bit (its DC difference's code; a sequential scan adds an end-of-block code),
// and every component is coded (a missing scan would have been a fatal warning above). Checked against the
// real data before a pixel is allocated, it refuses a small file whose header lies about a huge image.
// (Arithmetic coding has no such bound: the time budget stops those.)
size_t huffman_bytes_needed(const jpeg_decompress_struct& cinfo) {
  uint64_t fewest = UINT64_MAX;
  for (int c = 0; c < cinfo.num_components; ++c)
    fewest = std::min<uint64_t>(
        fewest, uint64_t(cinfo.comp_info[c].width_in_blocks) * uint64_t(cinfo.comp_info[c].height_in_blocks));
  return size_t(fewest / 8);
}

// No C++ object with a destructor lives in this frame: libjpeg leaves it by longjmp on any error.
JpegStep jpeg_decode_raw(std::span<const uint8_t> bytes, const ImageLimits* limits, JpegErrors* err,
                         DecodedImage* out) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->pub);
  err->pub.error_exit = jpeg_on_error;
  err->pub.emit_message = jpeg_on_message;
  err->progress.progress_monitor = jpeg_on_progress;
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return JpegStep::error;
  }
  jpeg_create_decompress(&cinfo);
  cinfo.progress = &err->progress;
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
  else if (!cinfo.arith_code && huffman_bytes_needed(cinfo) > bytes.size())
    early = JpegStep::too_little_data;
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
  err.deadline = decode_deadline(limits);
  err.stop = JpegStop::none;
  DecodedImage out;
  out.format = ImageFormat::jpeg;
  switch (jpeg_decode_raw(bytes, &limits, &err, &out)) {
    case JpegStep::ok:
      return out;
    case JpegStep::too_little_data:
      throw ImageError(
          ImageErrorKind::undecodable,
          kiln::detail::concat("image: JPEG declares ", out.width, "x", out.height, " but holds ",
                               bytes.size(), " bytes: too few for an image that size"));
    case JpegStep::too_big:
    case JpegStep::bad_size:
      check_dimensions(out.width, out.height, limits, "JPEG");
      break;
    case JpegStep::cmyk:
      throw ImageError(ImageErrorKind::unsupported_format, "image: CMYK/YCCK JPEG is not supported");
    case JpegStep::error:
      if (err.stop == JpegStop::time_budget) throw_decode_timeout(limits, "JPEG");
      if (err.stop == JpegStop::too_many_scans)
        throw ImageError(ImageErrorKind::undecodable,
                         kiln::detail::concat("image: progressive JPEG with more than ", kMaxJpegScans,
                                              " scans (the limit)"));
      break;
  }
  const bool truncated = err.pub.msg_code == JWRN_JPEG_EOF;
  throw ImageError(ImageErrorKind::undecodable, std::string("image: JPEG does not decode: ") +
                                                    (truncated ? "truncated data" : err.message));
}

}  // namespace kiln::vision::detail
