// Qwen3-VL's vision tower (transformers' Qwen3VLVisionModel), written against the ops API:
//   x   = patch_embed(pixel rows)                     a Conv3d with kernel = stride = a GEMM + bias
//   x  += bilinear(pos_embed, patch grid)             fast_pos_embed_interpolate, bf16 as HF rounds it
//   per block: x += proj(attn(rope_2d(qkv(LN1(x)))))  full attention within each image frame
//              x += fc2(act(fc1(LN2(x))))              act = vision_config.hidden_act (tanh GELU)
//              after the blocks in deepstack_visual_indexes: a deepstack merger's output
//   merged = fc2(GELU(fc1(LN(x) viewed as [N/4, 4h])))   the patch merger (2x2 -> decoder width)
//   deepstack merger: fc2(GELU(fc1(LN(x viewed as [N/4, 4h]))))   (its norm after the shuffle)
// The merger and deepstack GELUs are exact (nn.GELU()). The tower runs on the model's device (CPU oracle or
// CUDA); its outputs come back as host bf16 rows that the runner keeps until the decoder has consumed them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kiln/config.h"
#include "kiln/error.h"
#include "kiln/safetensors.h"
#include "kiln/tensor.h"
#include "model/weights.h"
#include "vision/image_input.h"

namespace kiln {

struct VisionLinear {
  Tensor w;  // bf16 [out, in]
  Tensor b;  // bf16 [out]
};
struct VisionNorm {
  Tensor w, b;  // bf16 [n]
};
struct VisionBlockWeights {
  VisionNorm norm1, norm2;
  VisionLinear qkv, proj, fc1, fc2;
};
struct VisionMergerWeights {
  VisionNorm norm;  // [h] (patch merger) or [4h] (deepstack mergers: after the shuffle)
  VisionLinear fc1, fc2;
};
struct VisionWeights {
  std::vector<Buffer> storage;  // owns every tensor below (on the tower's device)
  VisionLinear patch_embed;     // w: [h, in_channels * temporal * patch * patch] (the Conv3d kernel, flat)
  Tensor pos_embed;             // bf16 [num_position_embeddings, h]
  std::vector<VisionBlockWeights> blocks;
  VisionMergerWeights merger;
  std::vector<VisionMergerWeights> deepstack;
};

// Every model.visual.* tensor of this config with its checkpoint shape (the patch embedding's 5-D Conv3d
// kernel), in a fixed order; norm weights marked `norm` (ones-like in random weights).
std::vector<WeightSpec> qwen3_vl_vision_weight_specs(const ModelConfig& cfg);

// One image's encoder output: bf16 rows in the order of its image-pad tokens.
// Thrown by Qwen3VLVision::encode when its `stop` check says so between blocks: the pass was cut short and
// produced nothing.
class VisionCancelled : public Error {
 public:
  VisionCancelled() : Error("the vision pass was cancelled") {}
};

struct VisionOutput {
  int64_t tokens = 0;                          // merged rows: grid_t * (grid_h / m) * (grid_w / m)
  std::vector<bf16_t> embeds;                  // [tokens, out_hidden]: the patch merger's output
  std::vector<std::vector<bf16_t>> deepstack;  // per deepstack layer: [tokens, out_hidden]
};

class Qwen3VLVision {
 public:
  // Weights from `ckpt` (model.visual.*, bf16, exact shapes) or, when null, fill_random_weight(seed), on
  // `device`.
  Qwen3VLVision(const ModelConfig& cfg, const Checkpoint* ckpt, uint64_t seed, Device device = Device::cpu());

  const VisionConfig& config() const { return cfg_; }
  Device device() const { return device_; }
  const VisionWeights& weights() const { return w_; }
  // Checks one image against the config (patch_dim, grid divisible by the merge size, values size): a
  // kiln::Error naming what is wrong.
  void check_image(const vision::ImagePatches& img) const;
  // Encodes the images in one pass (attention stays within each image frame); one output per image.
  // `stop` (when set) is called on the host before each block, after its attention and before the merger,
  // and on the CPU backend by the attention's worker threads (ops::varlen_attention): true throws
  // VisionCancelled. On CUDA it reads host state only between asynchronous launches: no sync.
  std::vector<VisionOutput> encode(const std::vector<const vision::ImagePatches*>& images,
                                   const std::function<bool()>& stop = {}) const;
  // The interpolated position embedding, bf16 [patches, h] in the processor's patch order (what encode adds
  // to the patch embedding): exposed for tests.
  std::vector<bf16_t> position_embedding(const vision::ImagePatches& img) const;

 private:
  VisionConfig cfg_;
  Device device_;
  VisionWeights w_;
};

}  // namespace kiln
