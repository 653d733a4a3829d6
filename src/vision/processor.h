// transformers' Qwen2-VL image processor (Qwen3-VL uses it unchanged), as a checkpoint's
// preprocessor_config.json configures it: smart_resize to multiples of patch_size * merge_size within
// [min_pixels, max_pixels], antialiased bicubic resize, rescale and normalize, a still image repeated to
// temporal_patch_size frames, and patchify into ImagePatches rows in the processor's order.
//
// transformers 5.x gives Qwen2VLImageProcessor (the torchvision backend) by default whenever torchvision is
// installed, whatever preprocessor_config.json's image_processor_type says ("Qwen2VLImageProcessorFast" is an
// alias of it); Qwen2VLImageProcessorPil only without torchvision or when asked. kiln follows: torchvision's
// integer resize unless image_processor_type names the Pil class.
#pragma once

#include <array>
#include <span>
#include <string_view>

#include "vision/decode.h"
#include "vision/image_input.h"
#include "vision/resample.h"

namespace kiln::vision {

struct ProcessorConfig {
  int patch_size = 14, temporal_patch_size = 2, merge_size = 2;  // the class defaults; Qwen3-VL: patch 16
  int64_t min_pixels = 56 * 56,
          max_pixels = 28 * 28 * 1280;  // the class defaults; Qwen3-VL sets 65536 / 16777216
  bool do_resize = true, do_rescale = true, do_normalize = true, do_convert_rgb = true;
  double rescale_factor = 1.0 / 255.0;
  std::array<double, 3> image_mean{0.48145466, 0.4578275, 0.40821073};  // OPENAI_CLIP_MEAN (class default)
  std::array<double, 3> image_std{0.26862954, 0.26130258, 0.27577711};  // OPENAI_CLIP_STD
  ResampleKernel kernel = ResampleKernel::torchvision;

  int factor() const { return patch_size * merge_size; }
  int patch_dim() const { return 3 * temporal_patch_size * patch_size * patch_size; }
};

// Parses preprocessor_config.json as the processor's __init__ reads it: size.shortest_edge/longest_edge, then
// min_pixels/max_pixels override them; image_mean/std as lists (or one number for all channels); resample
// must be 3 (bicubic: the only filter implemented). Throws kiln::Error naming the field for a malformed file
// or a setting kiln does not implement (do_convert_rgb false, another resample, non-positive sizes).
ProcessorConfig parse_processor_config(std::string_view json_text);

// transformers' smart_resize: {height, width}. Throws ImageError(bad_aspect_ratio) past 200:1.
std::array<int, 2> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels);

// The processor's resize step alone: smart_resize's size, bicubic with config.kernel (the image unchanged
// when do_resize is off or the size already fits). Throws kiln::Error when do_resize is off and the size is
// not a multiple of the factor.
RgbImage resize_for_processor(const RgbImage& image, const ProcessorConfig& config);

// One decoded RGB image -> ImagePatches (values in float32 exactly as the torchvision backend computes them:
// (float(x) - mean * 255) / (std * 255), the fused rescale+normalize, or the Pil backend's x * (1/255) then
// (x - mean) / std, each in float32; content_hash of the decoded RGB pixels and their size).
ImagePatches preprocess_image(const RgbImage& image, const ProcessorConfig& config);

// decode_rgb then preprocess_image.
ImagePatches preprocess_image_bytes(std::span<const uint8_t> bytes, const ProcessorConfig& config,
                                    const ImageLimits& limits);

// 128 bits of SHA-256 over (width, height, RGB bytes): collision-resistant, so one client cannot craft an
// image whose cached pages another image would reuse.
std::array<uint64_t, 2> image_content_hash(const RgbImage& image);

}  // namespace kiln::vision
