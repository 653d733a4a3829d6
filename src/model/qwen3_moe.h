// Qwen3-MoE's and Qwen3-VL-MoE's sparse MLP layers (config.is_moe_layer): their checkpoint tensors and their
// loading. The block itself is ops::moe_mlp (ops/moe.h); Qwen3Model calls it in place of the dense MLP on
// those layers.
//
// Checkpoint layouts read (all hold the same values; ExpertLayout below), the router always
// L.mlp.gate.weight [E, H]:
//   per_expert (Qwen3-MoE as the hub ships it; transformers 5's save_pretrained by default):
//     L.mlp.experts.e.{gate,up}_proj.weight [I, H]; L.mlp.experts.e.down_proj.weight [H, I] for e in
//     [0, E); block-FP8 (Qwen3-30B-A3B-FP8): each expert weight F8_E4M3 with its NAME.weight_scale_inv
//     [ceil(rows/128), ceil(cols/128)], the router bf16
//   fused (transformers 5's in-memory layout, saved with save_original_format=False):
//     L.mlp.experts.gate_up_proj [E, 2I, H] (gate rows first); L.mlp.experts.down_proj [E, H, I]
//   fused_transposed (Qwen3-VL-MoE as the hub ships it, Qwen3-VL-30B-A3B-Instruct: transformers 4.57's
//     Qwen3VLMoeTextExperts computes x @ gate_up_proj[e], then chunks the 2I outputs into gate, up):
//     L.mlp.experts.gate_up_proj [E, H, 2I] (columns [0, I) gate, [I, 2I) up);
//     L.mlp.experts.down_proj [E, I, H]
// where L = weight_prefix + "layers.<l>" and I = moe_intermediate_size. The fused layouts are bf16 only;
// the shapes tell them apart (they coincide only for H == 2I and H == I at once, which no I > 0 allows).
#pragma once

#include <cstdint>
#include <deque>
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

enum class ExpertLayout : uint8_t { per_expert, fused, fused_transposed };

// How `ckpt` stores sparse layer l's experts: fused or fused_transposed where it holds
// L.mlp.experts.gate_up_proj, else per_expert. Throws naming the tensor for a fused tensor that is not bf16
// (block-FP8 experts are read per expert only), a fused shape that fits neither fused layout, or one of the
// fused pair without the other.
ExpertLayout checkpoint_expert_layout(const ModelConfig& cfg, int64_t l, const Checkpoint& ckpt);

// Experts [e0, e1) of sparse layer l with intermediate rows [i0, i1) (gate and up rows, down columns; a
// tensor-parallel rank's share, or all of them) read from a fused layout into kiln's, written to host memory
// the caller owns: gate_up [e1 - e0, 2 (i1 - i0), H] (each expert's gate rows, then its up rows) and
// down [e1 - e0, H, i1 - i0].
void read_fused_experts(const ModelConfig& cfg, int64_t l, const Checkpoint& ckpt, ExpertLayout layout,
                        int64_t e0, int64_t e1, int64_t i0, int64_t i1, bf16_t* gate_up, bf16_t* down);

// Writing fused checkpoints (demo-model --arch vl-moe, tests): `in` with each sparse layer's per-expert
// tensors (cfg's names) replaced by that layer's L.mlp.experts.gate_up_proj and L.mlp.experts.down_proj in
// `layout` (fused or fused_transposed), placed where the layer's first expert tensor was; other tensors pass
// through. The returned tensors view `storage`, which must outlive them.
std::vector<NamedTensor> fuse_checkpoint_experts(const ModelConfig& cfg, const std::vector<NamedTensor>& in,
                                                 ExpertLayout layout,
                                                 std::deque<std::vector<bf16_t>>& storage);

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

// Sparse layer l's weights: the router through `stacked` (always bf16); the experts from a fused layout
// where `ckpt` has one (bf16, converted on the host; --quantization fp8 quantizes them where the per-expert
// path would, on the GPU under fp8_quantize_on_gpu() else on the host, into the same bytes), else from the
// per-expert layout through `linear` (block-FP8 where the checkpoint or --quantization fp8 says). Block-FP8
// experts need moe_intermediate_size and hidden_size multiples of 128 (else an error). Fused experts are
// copied to `device` into buffers appended to `storage`.
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
