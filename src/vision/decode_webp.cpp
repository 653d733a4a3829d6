// WebP through libwebp's simple decoder (fancy upsampling on, as in the animation decoder Pillow uses; a
// still image's first and only frame is not blended, so the two agree). Animated WebP is refused.
#include <webp/decode.h>

#include "vision/decode.h"

namespace kiln::vision::detail {

DecodedImage decode_webp(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  WebPBitstreamFeatures f;
  const VP8StatusCode status = WebPGetFeatures(bytes.data(), bytes.size(), &f);
  if (status == VP8_STATUS_NOT_ENOUGH_DATA)
    throw ImageError(ImageErrorKind::undecodable, "image: WebP does not decode: truncated data");
  if (status == VP8_STATUS_UNSUPPORTED_FEATURE)
    throw ImageError(ImageErrorKind::unsupported_format,
                     "image: WebP uses a feature libwebp does not support");
  if (status != VP8_STATUS_OK)
    throw ImageError(ImageErrorKind::undecodable, kiln::detail::concat("image: WebP does not decode (status ",
                                                                       static_cast<int>(status), ")"));
  if (f.has_animation)
    throw ImageError(ImageErrorKind::unsupported_format, "image: animated WebP is not supported");
  check_dimensions(f.width, f.height, limits, "WebP");
  DecodedImage out;
  out.format = ImageFormat::webp;
  out.width = f.width;
  out.height = f.height;
  out.channels = f.has_alpha ? 4 : 3;
  const int stride = f.width * out.channels;
  out.pixels.resize(static_cast<size_t>(stride) * static_cast<size_t>(f.height));
  const uint8_t* ok =
      f.has_alpha
          ? WebPDecodeRGBAInto(bytes.data(), bytes.size(), out.pixels.data(), out.pixels.size(), stride)
          : WebPDecodeRGBInto(bytes.data(), bytes.size(), out.pixels.data(), out.pixels.size(), stride);
  if (!ok)
    throw ImageError(ImageErrorKind::undecodable, "image: WebP does not decode: corrupt or truncated data");
  return out;
}

}  // namespace kiln::vision::detail
