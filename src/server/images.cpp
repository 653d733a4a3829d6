#include "server/images.h"

#include <future>

namespace kiln::server {

using vision::ImageErrorKind;

ApiError image_api_error(const vision::ImageError& e, const std::string& param) {
  const char* code = "invalid_image";
  int status = 400;
  switch (e.kind()) {
    case ImageErrorKind::undecodable:
      code = "invalid_image";
      break;
    case ImageErrorKind::unsupported_format:
      code = "unsupported_image_format";
      break;
    case ImageErrorKind::bad_aspect_ratio:
      code = "invalid_image_size";
      break;
    case ImageErrorKind::too_many_bytes:
    case ImageErrorKind::too_many_pixels:
    case ImageErrorKind::decode_timeout:
      code = "image_too_large";
      status = 413;
      break;
    case ImageErrorKind::too_many_images:
      code = "too_many_images";
      break;
    case ImageErrorKind::fetch_failed:
      code = "image_fetch_failed";
      break;
  }
  return ApiError(status, "'" + param + "': " + e.what(), param, "", code);
}

std::vector<uint8_t> decode_base64(std::string_view text, const std::string& param) {
  auto value = [](unsigned char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;  // '-' and '_': the URL-safe alphabet, which some clients send
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3 + 3);
  uint32_t acc = 0;
  int bits = 0, pad = 0;
  size_t symbols = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      ++pad;
      continue;
    }
    const int v = value(c);
    if (v < 0 || pad > 0)
      throw ApiError(400, "'" + param + "': invalid base64 (character " + std::to_string(i) + ")", param, "",
                     "invalid_image");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    ++symbols;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  // As Python's b64decode (what vLLM and SGLang decode with): whole 4-character groups, '=' padding included.
  if ((symbols + static_cast<size_t>(pad)) % 4 != 0 || pad > 2 || symbols % 4 == 1)
    throw ApiError(400, "'" + param + "': invalid base64 (truncated)", param, "", "invalid_image");
  return out;
}

std::vector<uint8_t> image_bytes(const ImageRef& ref, const VisionSetup& setup) {
  const std::string& s = ref.source;
  const size_t max_b64 = setup.limits.max_bytes / 3 * 4 + 8;
  if (s.rfind("data:", 0) == 0) {
    const size_t comma = s.find(',');
    if (comma == std::string::npos)
      throw ApiError(400, "'" + ref.param + "': a data: URL needs a ','", ref.param, "", "invalid_image");
    const std::string_view header(s.data() + 5, comma - 5);
    if (header.size() < 7 || header.substr(header.size() - 7) != ";base64")
      throw ApiError(400, "'" + ref.param + "': only base64 data: URLs are supported", ref.param, "",
                     "invalid_image");
    if (s.size() - comma - 1 > max_b64)
      throw image_api_error(vision::ImageError(ImageErrorKind::too_many_bytes,
                                               "the image is larger than the limit of " +
                                                   std::to_string(setup.limits.max_bytes) + " bytes"),
                            ref.param);
    return decode_base64(std::string_view(s).substr(comma + 1), ref.param);
  }
  if (s.rfind("http://", 0) == 0 || s.rfind("https://", 0) == 0) {
    if (!setup.fetch.allow_urls)
      throw ApiError(400,
                     "'" + ref.param +
                         "': image URLs are disabled on this server (--image-url-fetch off); "
                         "send the image as a data: URL",
                     ref.param, "", "image_fetch_failed");
    try {
      return fetch_url(s, setup.limits.max_bytes, setup.fetch);
    } catch (const vision::ImageError& e) {
      throw image_api_error(e, ref.param);
    }
  }
  if (ref.allow_raw_base64 && s.find(':') == std::string::npos) {
    if (s.size() > max_b64)
      throw image_api_error(vision::ImageError(ImageErrorKind::too_many_bytes,
                                               "the image is larger than the limit of " +
                                                   std::to_string(setup.limits.max_bytes) + " bytes"),
                            ref.param);
    return decode_base64(s, ref.param);
  }
  const size_t colon = s.find(':');
  throw ApiError(
      400,
      "'" + ref.param + "': unsupported image source" +
          (colon != std::string::npos && colon < 16 ? " scheme '" + s.substr(0, colon) + ":'" : "") +
          " (data: URLs with base64" + (setup.fetch.allow_urls ? " and http(s) URLs" : "") +
          (ref.allow_raw_base64 ? ", or raw base64" : "") + " are accepted)",
      ref.param, "", "invalid_image");
}

namespace {
vision::ImagePatches load_one(const ImageRef& ref, const VisionSetup& setup) {
  const std::vector<uint8_t> bytes = image_bytes(ref, setup);
  try {
    return vision::preprocess_image_bytes(bytes, setup.processor, setup.limits);
  } catch (const vision::ImageError& e) {
    throw image_api_error(e, ref.param);
  }
}
}  // namespace

std::vector<vision::ImagePatches> load_images(const std::vector<ImageRef>& refs, const VisionSetup& setup) {
  if (refs.size() > static_cast<size_t>(setup.limits.max_images))
    throw image_api_error(vision::ImageError(ImageErrorKind::too_many_images,
                                             std::to_string(refs.size()) + " images exceed the limit of " +
                                                 std::to_string(setup.limits.max_images) + " per request"),
                          refs[setup.limits.max_images].param);
  std::vector<vision::ImagePatches> out;
  if (refs.size() == 1) {
    out.push_back(load_one(refs[0], setup));
    return out;
  }
  std::vector<std::future<vision::ImagePatches>> jobs;
  jobs.reserve(refs.size());
  for (const auto& r : refs)
    jobs.push_back(std::async(std::launch::async, load_one, std::cref(r), std::cref(setup)));
  for (auto& j : jobs) j.wait();  // all finish before any error leaves (they reference refs and setup)
  for (auto& j : jobs) out.push_back(j.get());
  return out;
}

}  // namespace kiln::server
