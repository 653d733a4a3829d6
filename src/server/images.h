// Image inputs of generation requests (Qwen3-VL): where they come from, how they are loaded, and the 4xx each
// failure gets. Sources: OpenAI chat content parts {"type": "image_url", "image_url": {"url": ...}} and
// SGLang /generate's image_data (a string or a list), each a `data:` URL with base64 data, an http(s) URL
// (fetched with a byte limit and a deadline), or (/generate only, as SGLang) raw base64. Loading runs on the
// HTTP worker thread that parses the request (never the engine thread or an I/O thread); several images of
// one request are fetched and preprocessed in parallel.
//
// Status codes: 400 for an undecodable or truncated image, an unsupported format or URL scheme, bad base64, a
// bad aspect ratio, too many images, an unreachable URL or a fetch timeout or HTTP error; 413 for an image
// over the byte or pixel limit; 400 for any image sent to a text-only model. The error's "code" names the
// kind (invalid_image, unsupported_image_format, image_too_large, too_many_images, image_fetch_failed, ...).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "vision/image_tokens.h"
#include "vision/processor.h"

namespace kiln::server {

struct ImageFetchOptions {
  bool allow_urls = true;                    // http(s) URLs (false: only data: URLs and raw base64)
  std::chrono::milliseconds timeout{10000};  // per image: connect + transfer
  int max_redirects = 3;
  // Loopback, private, link-local and other non-public addresses (server/address_policy.h) may be fetched:
  // --image-url-allow-private. Off: a 400 naming the address's range.
  bool allow_private = false;
};

// What the server needs to accept images: present only for a vision-language checkpoint.
struct VisionSetup {
  vision::ProcessorConfig processor;
  vision::ImageLimits limits;
  vision::VisionTokenIds tokens;
  ImageFetchOptions fetch;
};

struct ImageRef {
  std::string source;  // data: URL, http(s) URL, or raw base64 (allow_raw_base64)
  std::string param;   // the request field it came from, for errors ("messages[1].content[0].image_url.url")
  bool allow_raw_base64 = false;
};

// The ApiError for an ImageError (status and code by kind).
ApiError image_api_error(const vision::ImageError& e, const std::string& param);

// Decodes base64 (RFC 4648, '+/' or the URL-safe '-_', whole padded groups as Python's b64decode requires;
// ASCII whitespace skipped). Any other character is refused (Python would drop it silently). Throws ApiError
// 400 naming param.
std::vector<uint8_t> decode_base64(std::string_view text, const std::string& param);

// The encoded bytes of one source (base64-decoded or fetched). Throws ApiError.
std::vector<uint8_t> image_bytes(const ImageRef& ref, const VisionSetup& setup);

// Every image loaded and preprocessed, in order (in parallel when there are several). Throws ApiError for the
// first failing image (in request order); too many images is checked before any is loaded.
std::vector<vision::ImagePatches> load_images(const std::vector<ImageRef>& refs, const VisionSetup& setup);

// Fetches an http(s) URL: at most max_bytes, within timeout, following up to max_redirects redirects.
// Throws ImageError(fetch_failed | too_many_bytes) with the reason (image_fetch.cpp, cpp-httplib with
// OpenSSL).
std::vector<uint8_t> fetch_url(const std::string& url, size_t max_bytes, const ImageFetchOptions& opts);

}  // namespace kiln::server

namespace kiln {
class Tokenizer;
}

namespace kiln::server {

// The image setup for the checkpoint in model_dir (vision_setup.cpp): null when config.json has no
// vision_config (a text-only model), or has one but no preprocessor_config.json (then `note` says so: such a
// directory holds the text decoder alone, and images are refused); otherwise preprocessor_config.json parsed
// and the vision token ids from the tokenizer. kiln::Error for a malformed preprocessor_config.json, missing
// vision tokens, or ids that disagree with config.json's image_token_id / vision_start_token_id /
// vision_end_token_id.
std::shared_ptr<const VisionSetup> load_vision_setup(const std::string& model_dir, const Tokenizer& tokenizer,
                                                     const vision::ImageLimits& limits,
                                                     const ImageFetchOptions& fetch, std::string& note);

}  // namespace kiln::server
