// The seam between image preprocessing (src/vision: decode, resize, normalize, patchify) and the Qwen3-VL
// vision encoder (src/model). One struct per image, laid out exactly as transformers' Qwen2-VL/Qwen3-VL image
// processor emits `pixel_values` and `image_grid_thw`, so fixtures from transformers load into it unchanged.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace kiln::vision {

struct ImagePatches {
  // The grid in patches before the spatial merge (transformers' image_grid_thw row). A still image has
  // grid_t == 1: its two temporal frames are the same picture.
  int grid_t = 0, grid_h = 0, grid_w = 0;
  // Row length: in_channels * temporal_patch_size * patch_size * patch_size (3 * 2 * 16 * 16 = 1536 for
  // Qwen3-VL).
  int patch_dim = 0;
  // [grid_t * grid_h * grid_w, patch_dim], row-major, already normalized ((x / 255 - mean) / std). Rows in
  // the processor's order: each merge_size x merge_size group of patches is contiguous (t, h/m, w/m, m, m);
  // inside a row the values run channel, temporal frame, patch row, patch column.
  std::vector<float> values;
  // 128-bit hash of the decoded pixels and their size: the prefix cache keys the image's tokens by it, so a
  // repeated image reuses pages and two different images never share them.
  std::array<uint64_t, 2> content_hash{};

  int patches() const { return grid_t * grid_h * grid_w; }
  // LLM tokens this image becomes after the merge (one <|image_pad|> each).
  int merged_tokens(int merge_size) const { return grid_t * (grid_h / merge_size) * (grid_w / merge_size); }
};

}  // namespace kiln::vision
