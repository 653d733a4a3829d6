// From a tokenized chat prompt to the engine's prompt: each <|image_pad|> the chat template emitted (one per
// image, between <|vision_start|> and <|vision_end|>) becomes images[i].merged_tokens(merge_size) pads, as
// transformers' Qwen3-VL processor expands the text before tokenizing (the pad is a special token, so
// expanding the ids afterwards gives the same ids).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "vision/image_input.h"

namespace kiln::vision {

struct VisionTokenIds {
  int32_t vision_start = -1, vision_end = -1, image_pad = -1;
};

// Throws kiln::Error when the prompt's pad count differs from images.size() (naming both counts) or a pad is
// not directly between vision_start and vision_end.
std::vector<int32_t> expand_image_pads(std::span<const int32_t> ids, const std::vector<ImagePatches>& images,
                                       const VisionTokenIds& tokens, int merge_size);

// The number of <|image_pad|> tokens in ids (before expansion: one per image).
int count_image_pads(std::span<const int32_t> ids, const VisionTokenIds& tokens);

}  // namespace kiln::vision
