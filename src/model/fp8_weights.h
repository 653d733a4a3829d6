// Block-FP8 linears at load (docs/NUMERICS.md "Block-FP8 linear layers"): reading Qwen's -FP8 checkpoint
// tensors (F8_E4M3 NAME.weight + NAME.weight_scale_inv), quantizing bf16 weights online (--quantization
// fp8), and placing the result on the model's device as one ops::LinearWeight per stacked projection.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "kiln/config.h"
#include "kiln/safetensors.h"
#include "kiln/tensor.h"
#include "ops/fp8_linear.h"

namespace kiln {

// One checkpoint linear's block-FP8 data in host memory: q e4m3 [rows, cols] (into the checkpoint mapping,
// or `owned` when quantized at load) and its scales fp32 [ceil(rows/128), ceil(cols/128)].
struct Fp8HostPart {
  std::vector<uint8_t> owned;
  const uint8_t* q = nullptr;
  std::vector<float> scale;
  int64_t rows = 0, cols = 0;
};

// "model.layers.0.mlp.down_proj.weight" -> whether quantization_config.modules_to_not_convert names that
// module: an entry matching whole dotted components of the module name ("down_proj", "mlp.down_proj",
// "model.layers.0.mlp"; "mlp.gate" is the MoE router, not "mlp.gate_proj"). It decides what online
// quantization leaves bf16; a checkpoint's own storage decides the rest (an F8_E4M3 weight with its scales
// runs in FP8 whatever the list says).
bool fp8_module_excluded(const QuantConfig& q, const std::string& weight_name);

// How the checkpoint stores linear `weight_name` ([rows, cols]): true for F8_E4M3 with a valid
// NAME.weight_scale_inv (F32 or BF16, [ceil(rows/128), ceil(cols/128)]), false for anything else (the
// caller's bf16 read then checks dtype and shape). Throws naming the tensor for an FP8 weight without
// quantization_config, a wrong shape, a missing or malformed scale, or a scale next to a weight that is not
// F8_E4M3.
bool checkpoint_linear_is_fp8(const QuantConfig& q, const Checkpoint& ckpt, const std::string& weight_name,
                              int64_t rows, int64_t cols);
// Reads a linear that checkpoint_linear_is_fp8 accepted (scales widened to fp32; a non-finite or negative
// scale is an error naming the tensor).
Fp8HostPart read_fp8_part(const Checkpoint& ckpt, const std::string& weight_name, int64_t rows, int64_t cols);
// Online quantization of one bf16 weight [rows, cols] (ops::quantize_weight_fp8).
Fp8HostPart quantize_fp8_part(const bf16_t* w, int64_t rows, int64_t cols, const std::string& name);

// Stacks the parts along rows into one projection on `device` (its buffers appended to `storage`):
//   CPU: the e4m3 matrix and its scales, run by the block-FP8 CPU path; every part but the last must have a
//        multiple of 128 rows so the block grid stays aligned (else an error naming the part);
//   CUDA, where fp8_weights_stay_fp8(device) and the parts' block grid is aligned as on the CPU: the e4m3
//        matrix and its scales on the device (no bf16 copy), run by the weight-only FP8 GEMV for small M and
//        dequantized into GemmEngine's scratch (reserved here for the largest weight) otherwise;
//   CUDA otherwise: the dequantized bf16 matrix (path (c), the portable CUDA path), one dequantization kernel
//        per part.
// KILN_FP8_DEQUANT=1 (for A/B runs): CUDA dequantizes FP8 weights at load whatever the GPU; 0 or unset: not.
bool fp8_dequant_forced();
// Whether block-FP8 weights placed on `device` stay FP8: the CPU always; a CUDA device of compute capability
// 8.9 or newer (the e4m3 -> f16 conversion the FP8 GEMV widens with) unless fp8_dequant_forced().
bool fp8_weights_stay_fp8(Device device);

ops::LinearWeight place_fp8_linear(const std::vector<Fp8HostPart>& parts,
                                   const std::vector<std::string>& names, Device device,
                                   std::vector<Buffer>& storage);
// Whether place_fp8_linear keeps a stack of parts with these row counts e4m3 on `device` (every part but the
// last whole 128-row blocks, and fp8_weights_stay_fp8): then quantize_fp8_stack_on_device followed by
// reserve_fp8_gemm_buffers places it as place_fp8_linear would, bitwise.
bool fp8_stack_stays_fp8(const std::vector<int64_t>& rows, Device device);
// GemmEngine's FP8 buffers grown for a stacked FP8 weight of rows x cols placed on `device` (CUDA; nothing on
// the CPU), before any graph capture.
void reserve_fp8_gemm_buffers(Device device, int64_t rows, int64_t cols);

// The parts stacked along rows as e4m3 + scales on `device` (buffers appended to `storage`), as they are: the
// caller has checked that every part but the last fills whole 128-row blocks.
ops::LinearWeight upload_fp8_stack(const std::vector<Fp8HostPart>& parts, Device device,
                                   std::vector<Buffer>& storage);

// Online quantization on a CUDA device (the loader's path for MoE experts, tens of GB that the host
// quantizer took minutes over): part i's bf16 [rows[i], cols] values are written by fill(i, dst) into a
// device staging buffer (dst, contiguous; the fill is done when it returns or is enqueued on the legacy
// stream), then quantized there (ops/cuda/fp8_weight_quant.h) into its rows of one e4m3 stack and its scale
// rows. The result is bitwise quantize_fp8_part of each part then upload_fp8_stack. Every part but the last
// must fill whole 128-row blocks, and a non-finite weight is an error naming its part, both as on the host.
// Buffers appended to `storage`. CUDA builds only.
// The loader takes this path where fp8_quantize_on_gpu(): KILN_FP8_QUANTIZE_ON_GPU "0" or "1" (read once),
// unset kFp8QuantizeOnGpuDefault; 0 quantizes on the host as at `2f94697` (the same bytes, minutes slower
// for 30B-A3B).
constexpr bool kFp8QuantizeOnGpuDefault = true;
bool fp8_quantize_on_gpu();
using DeviceBf16Fill = std::function<void(size_t part, void* device_dst)>;
ops::LinearWeight quantize_fp8_stack_on_device(const std::vector<std::string>& names,
                                               const std::vector<int64_t>& rows, int64_t cols,
                                               const DeviceBf16Fill& fill, Device device,
                                               std::vector<Buffer>& storage);

// Writing FP8 checkpoints (demo-model --quantization fp8, tests): each tensor of `in` for which
// `is_linear(name)` holds (a bf16 [out, in] "*.weight") is replaced by its online quantization, F8_E4M3, and
// followed by NAME.weight_scale_inv (F32, or BF16 when bf16_scales: the scale rounded to bf16, and the e4m3
// values requantized against that rounded scale so w ~= q * scale still holds). The returned tensors view
// `storage`, which must outlive them; other tensors pass through.
struct Fp8CheckpointStorage {
  std::deque<std::vector<uint8_t>> bytes;
  std::deque<std::vector<float>> f32;
  std::deque<std::vector<bf16_t>> bf16;
};
std::vector<NamedTensor> quantize_checkpoint_linears(const std::vector<NamedTensor>& in,
                                                     const std::function<bool(const std::string&)>& is_linear,
                                                     bool bf16_scales, Fp8CheckpointStorage& storage);
// The config.json block of such a checkpoint (Qwen's -FP8 layout).
std::string fp8_quantization_config_json(const std::vector<std::string>& modules_to_not_convert = {});

}  // namespace kiln
