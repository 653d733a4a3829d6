// Shared by the Qwen3-VL tests: a tiny Qwen3-VL config (512-token vocabulary, a 2-layer decoder with
// interleaved M-RoPE, a 2-block vision tower with 4-pixel patches and deepstack after both blocks), images
// with seeded random patch values, and prompts holding their pad tokens.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "kiln/config.h"
#include "runtime/qwen3_runner.h"
#include "vision/image_input.h"

namespace kiln::test {

inline constexpr int32_t kVisionStart = 500, kImagePad = 501, kVisionEnd = 502, kVideoPad = 503;

inline nlohmann::json tiny_vl_config_json() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
    "image_token_id": 501, "video_token_id": 503, "vision_start_token_id": 500, "vision_end_token_id": 502,
    "tie_word_embeddings": true,
    "text_config": {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "hidden_act": "silu",
      "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "dtype": "bfloat16", "eos_token_id": 511,
      "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [12, 10, 10],
                          "mrope_interleaved": true}},
    "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
      "in_channels": 3, "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2,
      "out_hidden_size": 64, "num_position_embeddings": 16, "deepstack_visual_indexes": [0, 1],
      "hidden_act": "gelu_pytorch_tanh"}})");
}

inline ModelConfig tiny_vl_config() {
  return parse_model_config(tiny_vl_config_json().dump(), "tiny VL config");
}

// The placement before decode steps went plain: three M-RoPE rows on every step of a Qwen3-VL model
// (eager steps only: an M-RoPE step never replays a graph).
class MropeEveryStepRunner : public Qwen3Runner {
 public:
  using Qwen3Runner::Qwen3Runner;
  void place_positions(BatchDesc& batch) const override { batch.set_text_mrope(); }
};

// An image of grid 1 x gh x gw patches (patch_dim 3 * 2 * 4 * 4 = 96 for the tiny tower; 1536 for the demo's
// 16-pixel patches) with values in [-1, 1] from `seed`.
inline vision::ImagePatches test_image(int gh, int gw, uint32_t seed, int patch_dim = 96) {
  vision::ImagePatches img;
  img.grid_t = 1;
  img.grid_h = gh;
  img.grid_w = gw;
  img.patch_dim = patch_dim;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  img.values.resize(size_t(gh) * size_t(gw) * size_t(patch_dim));
  for (float& v : img.values) v = d(rng);
  img.content_hash = {0x1234567800000000ull ^ seed, 0x9abcdef000000000ull + seed};
  return img;
}

// text_before, then per image <|vision_start|> pads <|vision_end|> and a few text tokens.
inline std::vector<int32_t> vl_prompt(const std::vector<vision::ImagePatches>& images, int text_before,
                                      int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < text_before; ++i) p.push_back((i * 7 + salt * 13) % 400 + 1);
  for (size_t k = 0; k < images.size(); ++k) {
    p.push_back(kVisionStart);
    p.insert(p.end(), size_t(images[k].merged_tokens(2)), kImagePad);
    p.push_back(kVisionEnd);
    for (int i = 0; i < 3; ++i) p.push_back((int(k) * 31 + i * 3 + salt) % 400 + 1);
  }
  return p;
}

}  // namespace kiln::test
