#include "vision/processor.h"

#include <openssl/evp.h>

#include <cfenv>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

namespace kiln::vision {
namespace {

using json = nlohmann::json;

int64_t positive_int(const json& j, const char* field) {
  KILN_CHECK(j.is_number_integer() && j.get<int64_t>() > 0, "preprocessor_config.json: ", field,
             " must be a positive integer, got ", j.dump());
  return j.get<int64_t>();
}

std::array<double, 3> triple(const json& j, const char* field) {
  if (j.is_number()) return {j.get<double>(), j.get<double>(), j.get<double>()};
  KILN_CHECK(j.is_array() && j.size() == 3 && j[0].is_number() && j[1].is_number() && j[2].is_number(),
             "preprocessor_config.json: ", field, " must be a number or 3 numbers, got ", j.dump());
  return {j[0].get<double>(), j[1].get<double>(), j[2].get<double>()};
}

bool flag(const json& cfg, const char* field, bool fallback) {
  if (!cfg.contains(field) || cfg[field].is_null()) return fallback;
  KILN_CHECK(cfg[field].is_boolean(), "preprocessor_config.json: ", field, " must be true or false");
  return cfg[field].get<bool>();
}

// Python's round() on a double: ties to even.
double py_round(double v) {
  const int saved = std::fegetround();
  std::fesetround(FE_TONEAREST);
  const double r = std::nearbyint(v);
  std::fesetround(saved);
  return r;
}

}  // namespace

ProcessorConfig parse_processor_config(std::string_view text) {
  json cfg;
  try {
    cfg = json::parse(text);
  } catch (const json::exception& e) {
    KILN_FAIL("preprocessor_config.json is not JSON: ", e.what());
  }
  KILN_CHECK(cfg.is_object(), "preprocessor_config.json must be a JSON object");
  ProcessorConfig c;
  if (cfg.contains("patch_size"))
    c.patch_size = static_cast<int>(positive_int(cfg["patch_size"], "patch_size"));
  if (cfg.contains("temporal_patch_size"))
    c.temporal_patch_size = static_cast<int>(positive_int(cfg["temporal_patch_size"], "temporal_patch_size"));
  if (cfg.contains("merge_size"))
    c.merge_size = static_cast<int>(positive_int(cfg["merge_size"], "merge_size"));
  if (cfg.contains("size") && !cfg["size"].is_null()) {
    const json& size = cfg["size"];
    KILN_CHECK(size.is_object() && size.contains("shortest_edge") && size.contains("longest_edge"),
               "preprocessor_config.json: size must contain 'shortest_edge' and 'longest_edge', got ",
               size.dump());
    c.min_pixels = positive_int(size["shortest_edge"], "size.shortest_edge");
    c.max_pixels = positive_int(size["longest_edge"], "size.longest_edge");
  }
  if (cfg.contains("min_pixels") && !cfg["min_pixels"].is_null())
    c.min_pixels = positive_int(cfg["min_pixels"], "min_pixels");
  if (cfg.contains("max_pixels") && !cfg["max_pixels"].is_null())
    c.max_pixels = positive_int(cfg["max_pixels"], "max_pixels");
  KILN_CHECK(c.min_pixels <= c.max_pixels, "preprocessor_config.json: min pixels ", c.min_pixels,
             " > max pixels ", c.max_pixels);
  c.do_resize = flag(cfg, "do_resize", true);
  c.do_rescale = flag(cfg, "do_rescale", true);
  c.do_normalize = flag(cfg, "do_normalize", true);
  c.do_convert_rgb = flag(cfg, "do_convert_rgb", true);
  KILN_CHECK(c.do_convert_rgb, "preprocessor_config.json: do_convert_rgb false is not supported");
  if (cfg.contains("rescale_factor")) {
    KILN_CHECK(cfg["rescale_factor"].is_number(),
               "preprocessor_config.json: rescale_factor must be a number");
    c.rescale_factor = cfg["rescale_factor"].get<double>();
    KILN_CHECK(c.rescale_factor > 0, "preprocessor_config.json: rescale_factor must be positive");
  }
  if (cfg.contains("image_mean") && !cfg["image_mean"].is_null())
    c.image_mean = triple(cfg["image_mean"], "image_mean");
  if (cfg.contains("image_std") && !cfg["image_std"].is_null())
    c.image_std = triple(cfg["image_std"], "image_std");
  for (double s : c.image_std) KILN_CHECK(s != 0.0, "preprocessor_config.json: image_std has a zero");
  if (cfg.contains("resample") && !cfg["resample"].is_null())
    KILN_CHECK(cfg["resample"].is_number_integer() && cfg["resample"].get<int>() == 3,
               "preprocessor_config.json: resample ", cfg["resample"].dump(),
               " is not supported (3, bicubic, is what Qwen2-VL/Qwen3-VL use)");
  if (cfg.contains("image_processor_type") && cfg["image_processor_type"].is_string()) {
    const std::string type = cfg["image_processor_type"].get<std::string>();
    if (type.size() >= 3 && type.compare(type.size() - 3, 3, "Pil") == 0) c.kernel = ResampleKernel::pil;
  }
  return c;
}

std::array<int, 2> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels) {
  const double h = height, w = width, f = factor;
  if (std::max(h, w) / std::min(h, w) > 200)
    throw ImageError(ImageErrorKind::bad_aspect_ratio,
                     kiln::detail::concat("image: absolute aspect ratio must be smaller than 200, got ",
                                          width, "x", height));
  int64_t h_bar = static_cast<int64_t>(py_round(h / f)) * factor;
  int64_t w_bar = static_cast<int64_t>(py_round(w / f)) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt((h * w) / static_cast<double>(max_pixels));
    h_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    w_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return {static_cast<int>(h_bar), static_cast<int>(w_bar)};
}

std::array<uint64_t, 2> image_content_hash(const RgbImage& image) {
  uint8_t header[8];
  for (int i = 0; i < 4; ++i) {
    header[i] = static_cast<uint8_t>(static_cast<uint32_t>(image.width) >> (8 * i));
    header[4 + i] = static_cast<uint8_t>(static_cast<uint32_t>(image.height) >> (8 * i));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  KILN_CHECK(ctx != nullptr, "EVP_MD_CTX_new failed");
  const bool ok = EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1 &&
                  EVP_DigestUpdate(ctx, header, sizeof header) == 1 &&
                  EVP_DigestUpdate(ctx, image.rgb.data(), image.rgb.size()) == 1 &&
                  EVP_DigestFinal_ex(ctx, md, &md_len) == 1;
  EVP_MD_CTX_free(ctx);
  KILN_CHECK(ok && md_len >= 16, "SHA-256 failed");
  std::array<uint64_t, 2> out{};
  std::memcpy(out.data(), md, 16);
  return out;
}

RgbImage resize_for_processor(const RgbImage& image, const ProcessorConfig& c) {
  KILN_CHECK(image.width >= 1 && image.height >= 1, "image ", image.width, "x", image.height);
  if (!c.do_resize) {
    KILN_CHECK(image.height % c.factor() == 0 && image.width % c.factor() == 0, "image size ", image.width,
               "x", image.height, " is not a multiple of ", c.factor(), " (do_resize is off)");
    return image;
  }
  const auto hw = smart_resize(image.height, image.width, c.factor(), c.min_pixels, c.max_pixels);
  // The vision tower's cost grows with the square of its patches: its input never passes max_pixels
  // (smart_resize rounds down there; only a max_pixels below factor^2 could be passed, and is refused).
  if (int64_t(hw[0]) * hw[1] > c.max_pixels)
    throw ImageError(
        ImageErrorKind::too_many_pixels,
        kiln::detail::concat("image: resized to ", hw[1], "x", hw[0], ", over the processor's limit of ",
                             c.max_pixels, " pixels (max_pixels / size.longest_edge)"));
  return {hw[1], hw[0], resize_bicubic_rgb(image.rgb, image.width, image.height, hw[1], hw[0], c.kernel)};
}

ImagePatches preprocess_image(const RgbImage& image, const ProcessorConfig& c) {
  const RgbImage resized = resize_for_processor(image, c);
  const int out_h = resized.height, out_w = resized.width;
  const std::vector<uint8_t>& rgb = resized.rgb;

  // Per-channel affine map of a byte, computed once per value: the same float32 operations as the backend.
  std::array<std::array<float, 256>, 3> lut{};
  for (int ch = 0; ch < 3; ++ch) {
    for (int v = 0; v < 256; ++v) {
      float x = static_cast<float>(v);
      if (c.kernel == ResampleKernel::torchvision && c.do_rescale && c.do_normalize) {
        const float mean = static_cast<float>(c.image_mean[ch]) * static_cast<float>(1.0 / c.rescale_factor);
        const float std = static_cast<float>(c.image_std[ch]) * static_cast<float>(1.0 / c.rescale_factor);
        x = (x - mean) / std;
      } else {
        if (c.do_rescale) x = static_cast<float>(static_cast<double>(v) * c.rescale_factor);
        if (c.do_normalize)
          x = (x - static_cast<float>(c.image_mean[ch])) / static_cast<float>(c.image_std[ch]);
      }
      lut[ch][v] = x;
    }
  }

  const int p = c.patch_size, m = c.merge_size, tp = c.temporal_patch_size;
  ImagePatches out;
  out.grid_t = 1;
  out.grid_h = out_h / p;
  out.grid_w = out_w / p;
  out.patch_dim = c.patch_dim();
  out.values.resize(static_cast<size_t>(out.patches()) * out.patch_dim);
  float* dst = out.values.data();
  // Rows: (t, h / m, w / m, m, m); inside a row: (channel, frame, patch row, patch column).
  for (int bh = 0; bh < out.grid_h / m; ++bh)
    for (int bw = 0; bw < out.grid_w / m; ++bw)
      for (int mh = 0; mh < m; ++mh)
        for (int mw = 0; mw < m; ++mw) {
          const int y0 = (bh * m + mh) * p, x0 = (bw * m + mw) * p;
          for (int ch = 0; ch < 3; ++ch)
            for (int t = 0; t < tp; ++t)  // a still image: every frame is the same picture
              for (int py = 0; py < p; ++py) {
                const uint8_t* src = &rgb[(static_cast<size_t>(y0 + py) * out_w + x0) * 3 + ch];
                for (int px = 0; px < p; ++px) *dst++ = lut[ch][src[3 * px]];
              }
        }
  out.content_hash = image_content_hash(image);
  return out;
}

ImagePatches preprocess_image_bytes(std::span<const uint8_t> bytes, const ProcessorConfig& config,
                                    const ImageLimits& limits) {
  return preprocess_image(decode_rgb(bytes, limits), config);
}

}  // namespace kiln::vision
