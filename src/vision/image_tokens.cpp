#include "vision/image_tokens.h"

#include <algorithm>

#include "kiln/error.h"

namespace kiln::vision {

int count_image_pads(std::span<const int32_t> ids, const VisionTokenIds& tokens) {
  return static_cast<int>(std::count(ids.begin(), ids.end(), tokens.image_pad));
}

std::vector<int32_t> expand_image_pads(std::span<const int32_t> ids, const std::vector<ImagePatches>& images,
                                       const VisionTokenIds& tokens, int merge_size) {
  KILN_CHECK(merge_size >= 1, "merge_size ", merge_size);
  const int pads = count_image_pads(ids, tokens);
  KILN_CHECK(static_cast<size_t>(pads) == images.size(), "the prompt has ", pads,
             " image placeholder(s) but the request carries ", images.size(), " image(s)");
  size_t total = ids.size();
  for (const auto& im : images) total += static_cast<size_t>(im.merged_tokens(merge_size)) - 1;
  std::vector<int32_t> out;
  out.reserve(total);
  size_t next = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != tokens.image_pad) {
      out.push_back(ids[i]);
      continue;
    }
    KILN_CHECK(
        i > 0 && i + 1 < ids.size() && ids[i - 1] == tokens.vision_start && ids[i + 1] == tokens.vision_end,
        "image placeholder ", next + 1, " is not between <|vision_start|> and <|vision_end|>");
    const int n = images[next++].merged_tokens(merge_size);
    KILN_CHECK(n >= 1, "image ", next, " has no tokens");
    out.insert(out.end(), static_cast<size_t>(n), tokens.image_pad);
  }
  return out;
}

}  // namespace kiln::vision
