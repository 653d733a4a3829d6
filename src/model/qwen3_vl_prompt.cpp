#include "model/qwen3_vl_prompt.h"

#include <algorithm>

#include "kiln/error.h"

namespace kiln {
namespace {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

void check_vl_image(const VisionConfig& v, const vision::ImagePatches& img, size_t index) {
  const int64_t m = v.spatial_merge_size;
  KILN_CHECK(img.grid_t >= 1 && img.grid_h >= 1 && img.grid_w >= 1, "image ", index, ": grid ", img.grid_t,
             "x", img.grid_h, "x", img.grid_w, " must be positive");
  KILN_CHECK(img.grid_h % m == 0 && img.grid_w % m == 0, "image ", index, ": grid ", img.grid_h, "x",
             img.grid_w, " is not a multiple of spatial_merge_size ", m);
  KILN_CHECK(img.patch_dim == v.patch_dim(), "image ", index, ": patch_dim ", img.patch_dim,
             ", the vision tower takes ", v.patch_dim());
  KILN_CHECK(int64_t(img.values.size()) == int64_t(img.patches()) * v.patch_dim(), "image ", index, ": ",
             img.values.size(), " values for ", img.patches(), " patches of ", v.patch_dim());
}

VlPromptLayout layout_vl_prompt(const ModelConfig& cfg, const std::vector<int32_t>& prompt,
                                const std::vector<vision::ImagePatches>& images) {
  KILN_CHECK(cfg.has_vision || images.empty(), "this model (", cfg.architecture,
             ") is text-only: it takes no images");
  const int32_t n = int32_t(prompt.size());
  VlPromptLayout L;
  L.prompt_len = n;
  L.positions.assign(size_t(3) * size_t(n), 0);
  if (!cfg.has_vision) {
    for (int a = 0; a < 3; ++a)
      for (int32_t p = 0; p < n; ++p) L.positions[size_t(a) * size_t(n) + size_t(p)] = p;
    return L;
  }
  const VisionConfig& v = cfg.vision;
  const int64_t m = v.spatial_merge_size;
  for (size_t k = 0; k < images.size(); ++k) check_vl_image(v, images[k], k);
  auto set = [&](int32_t p, int32_t t, int32_t h, int32_t w) {
    L.positions[size_t(p)] = t;
    L.positions[size_t(n) + size_t(p)] = h;
    L.positions[2 * size_t(n) + size_t(p)] = w;
  };
  int32_t next = 0;  // one past the largest position so far
  size_t k = 0;
  for (int32_t p = 0; p < n;) {
    const int32_t tok = prompt[size_t(p)];
    KILN_CHECK(tok != v.video_token_id, "prompt token ", p,
               " is <|video_pad|>: video inputs are not supported");
    if (tok != v.image_token_id) {
      set(p, next, next, next);
      ++next;
      ++p;
      continue;
    }
    KILN_CHECK(k < images.size(), "the prompt has more image-pad runs than the request has images (",
               images.size(), ")");
    KILN_CHECK(p > 0 && prompt[size_t(p - 1)] == v.vision_start_token_id, "image ", k,
               ": its pad tokens must follow a <|vision_start|> token (prompt index ", p, ")");
    const vision::ImagePatches& img = images[k];
    const int32_t gt = img.grid_t, gh = int32_t(img.grid_h / m), gw = int32_t(img.grid_w / m);
    const int32_t count = img.merged_tokens(int(m));
    int32_t run = 0;
    while (p + run < n && prompt[size_t(p + run)] == v.image_token_id) ++run;
    KILN_CHECK(run == count, "image ", k, " (grid ", img.grid_t, "x", img.grid_h, "x", img.grid_w, ") needs ",
               count, " <|image_pad|> tokens; the prompt has ", run, " at index ", p);
    L.spans.push_back({p, count});
    int32_t r = 0;
    for (int32_t ti = 0; ti < gt; ++ti)
      for (int32_t hi = 0; hi < gh; ++hi)
        for (int32_t wi = 0; wi < gw; ++wi, ++r) set(p + r, next + ti, next + hi, next + wi);
    next += std::max({gt, gh, gw});
    p += count;
    ++k;
  }
  KILN_CHECK(k == images.size(), "the request has ", images.size(), " images but the prompt has ", k,
             " image-pad runs (<|vision_start|><|image_pad|>...<|vision_end|>)");
  L.delta = next - n;
  return L;
}

std::vector<int32_t> vl_cache_key(const VlPromptLayout& layout, const std::vector<int32_t>& prompt,
                                  const std::vector<vision::ImagePatches>& images) {
  KILN_CHECK_EQ(layout.spans.size(), images.size(), "vl_cache_key: one span per image");
  std::vector<int32_t> key = prompt;
  for (size_t k = 0; k < images.size(); ++k) {
    const auto& h = images[k].content_hash;
    const VlPromptLayout::Span& s = layout.spans[k];
    // Index -1 keys the <|vision_start|> before the pads: the first page holding any of the image's tokens
    // then carries at least two hash-derived keys.
    for (int32_t i = -1; i < s.count; ++i) {
      const uint64_t x = mix64(h[0] ^ mix64(h[1] + uint64_t(int64_t(i) + 2)));
      key[size_t(s.first_pad + i)] = int32_t(uint32_t(0x80000000u | uint32_t(x >> 33)));
    }
  }
  return key;
}

}  // namespace kiln
