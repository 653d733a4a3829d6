// Qwen3-MoE's sparse MLP layers (config.is_moe_layer): their checkpoint tensors and their loading. The block
// itself is ops::moe_mlp (ops/moe.h); Qwen3Model calls it in place of the dense MLP on those layers.
//
// Checkpoint layouts read (both hold the same values):
//   hub (Qwen's releases; transformers 5's save_pretrained by default):
//     L.mlp.gate.weight [E, H]; L.mlp.experts.e.{gate,up}_proj.weight [I, H];
//     L.mlp.experts.e.down_proj.weight [H, I] for e in [0, E); block-FP8 (Qwen3-30B-A3B-FP8): each expert
//     weight F8_E4M3 with its NAME.weight_scale_inv [ceil(rows/128), ceil(cols/128)], the router bf16
//   fused (transformers 5's in-memory layout, saved with save_original_format=False):
//     L.mlp.gate.weight [E, H]; L.mlp.experts.gate_up_proj [E, 2I, H] (gate rows first);
//     L.mlp.experts.down_proj [E, H, I]
// where L = weight_prefix + "layers.<l>" and I = moe_intermediate_size.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/config.h"
#include "kiln/safetensors.h"
#include "kiln/tensor.h"
#include "model/fp8_weights.h"
#include "model/weights.h"
#include "ops/moe.h"

namespace kiln {

// The hub-layout tensors of sparse layer l, in a fixed order: the router, then per expert gate, up, down.
void append_moe_layer_specs(const ModelConfig& cfg, int64_t l, std::vector<WeightSpec>& specs);

// Builds one device tensor of rows x cols from named [rows_i, cols] parts stacked in order (from the
// checkpoint, or random per part when there is none): the dense loader's (model/weights.cpp).
using StackedLoad =
    std::function<Tensor(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols)>;

// The same for a projection that may be block-FP8 (stored so, or quantized online): bf16 as `stacked`, or
// e4m3 with its block scales kept on the device (never dequantized: the expert kernels widen it).
using LinearLoad =
    std::function<ops::LinearWeight(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols)>;

// Stacks block-FP8 expert parts along rows on `device` as they are, e4m3 and scales (never dequantized: the
// expert kernels widen e4m3 themselves); every part but the last must fill whole 128-row blocks (an error
// naming the part). Buffers appended to `storage`.
ops::LinearWeight place_fp8_experts(const std::vector<Fp8HostPart>& parts,
                                    const std::vector<std::string>& names, Device device,
                                    std::vector<Buffer>& storage);

// Sparse layer l's weights: from the fused layout when `ckpt` has it (bf16 only), else the hub layout: the
// router through `stacked` (always bf16), the experts through `linear` (block-FP8 where the checkpoint or
// --quantization fp8 says; then moe_intermediate_size and hidden_size must be multiples of 128, else an
// error). Fused tensors are copied to `device` into buffers appended to `storage`.
ops::MoeWeights load_moe_layer(const ModelConfig& cfg, int64_t l, const Checkpoint* ckpt, Device device,
                               std::vector<Buffer>& storage, const StackedLoad& stacked,
                               const LinearLoad& linear);

// Block-FP8 experts of layer l need I (moe_intermediate_size, or a rank's slice of it) and H multiples of
// 128: an error naming both otherwise.
void check_fp8_expert_widths(int64_t l, int64_t I, int64_t H);
// w's experts from the row stacks gu [L * 2I, H] and dn [L * H, I] (both bf16, or both block-FP8 with their
// scales: else an error naming layer l) as MoeWeights' [L, 2I, H] and [L, H, I].
void set_stacked_experts(ops::MoeWeights& w, const ops::LinearWeight& gu, const ops::LinearWeight& dn,
                         int64_t l);

}  // namespace kiln
