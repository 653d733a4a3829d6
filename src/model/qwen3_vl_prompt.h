// A Qwen3-VL prompt with images: where each image's pad tokens are, the 3-axis M-RoPE positions of every
// prompt token (transformers' Qwen3VLModel.get_rope_index) and the prefix-cache key of the prompt.
//
// Positions: text tokens get equal (t, h, w) = p; image k (merged grid t x h' x w', h' = grid_h / merge)
// gets base + (ti, hi, wi) for its pads in (t, h', w') raster order, base = one past the largest position
// before it; the text after resumes at one past the image's largest position. Tokens past the prompt (the
// generation) sit at context position p + delta on all three axes, delta = (largest prompt position + 1) -
// prompt_len (<= 0).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kiln/config.h"
#include "vision/image_input.h"

namespace kiln {

struct VlPromptLayout {
  int32_t prompt_len = 0;
  std::vector<int32_t> positions;  // [3, prompt_len] row-major: the t row, the h row, the w row
  int32_t delta = 0;
  struct Span {
    int32_t first_pad = 0;  // prompt index of the image's first <|image_pad|>
    int32_t count = 0;      // its pads: merged_tokens(spatial_merge_size)
  };
  std::vector<Span> spans;  // one per image, in prompt order

  // The M-RoPE position of context position p on axis a (0 t, 1 h, 2 w).
  int32_t position(int32_t p, int a) const {
    return p < prompt_len ? positions[size_t(a) * size_t(prompt_len) + size_t(p)] : p + delta;
  }
};

// Checks one image against the vision config (grid positive and a multiple of the merge size, patch_dim,
// values size): a kiln::Error saying what is wrong.
void check_vl_image(const VisionConfig& v, const vision::ImagePatches& img, size_t index);

// Validates the prompt against its images and lays it out. Errors (kiln::Error, the request's 400): the model
// has no vision tower; an image fails check_vl_image; an <|image_pad|> run not preceded by <|vision_start|>,
// or whose length is not its image's merged_tokens; more or fewer runs than images; a <|video_pad|> token
// (videos are not supported). A prompt without images gets equal rows (delta 0) and no spans.
VlPromptLayout layout_vl_prompt(const ModelConfig& cfg, const std::vector<int32_t>& prompt,
                                const std::vector<vision::ImagePatches>& images);

// The prompt as the prefix cache keys it: each image's <|vision_start|> and pad tokens replaced by negative
// keys (never a token id) derived from the image's content_hash and the token's index in the image, so a
// repeated image matches the cached pages of its first occurrence and different images never share a page
// past their <|vision_start|> (a false match needs at least two 31-bit keys to collide). Other tokens keep
// their ids.
std::vector<int32_t> vl_cache_key(const VlPromptLayout& layout, const std::vector<int32_t>& prompt,
                                  const std::vector<vision::ImagePatches>& images);

}  // namespace kiln
