#include "model/qwen3_moe.h"

#include "kiln/error.h"
#include "ops/fp8_linear.h"

namespace kiln {
namespace {

std::string mlp_name(const ModelConfig& c, int64_t l, const std::string& leaf) {
  return c.weight_prefix + "layers." + std::to_string(l) + ".mlp." + leaf;
}
std::string expert_name(const ModelConfig& c, int64_t l, int64_t e, const char* proj) {
  return mlp_name(c, l, "experts." + std::to_string(e) + "." + proj + ".weight");
}

// A fused [E, rows, cols] checkpoint tensor, checked and copied to the device.
Tensor load_fused(const Checkpoint& ckpt, const std::string& name, int64_t E, int64_t rows, int64_t cols,
                  Device device, std::vector<Buffer>& storage) {
  const Tensor t = ckpt.get(name, DType::bf16, {E, rows, cols});
  Buffer buf(size_t(t.nbytes()), device);
  copy_bytes(buf.data(), device, t.data, Device::cpu(), size_t(t.nbytes()));
  const Tensor v = buf.view(DType::bf16, {E, rows, cols});
  storage.push_back(std::move(buf));
  return v;
}

}  // namespace

ops::LinearWeight place_fp8_experts(const std::vector<Fp8HostPart>& parts,
                                    const std::vector<std::string>& names, Device device,
                                    std::vector<Buffer>& storage) {
  KILN_CHECK(!parts.empty() && parts.size() == names.size(), "place_fp8_experts: no parts");
  for (size_t i = 0; i + 1 < parts.size(); ++i)
    KILN_CHECK(parts[i].rows % ops::kFp8Block == 0, "block-FP8 expert tensor '", names[i], "' has ",
               parts[i].rows, " rows, not a multiple of 128 (the experts' stack needs whole ",
               "128-row scale blocks)");
  return upload_fp8_stack(parts, device, storage);
}

void append_moe_layer_specs(const ModelConfig& c, int64_t l, std::vector<WeightSpec>& s) {
  const int64_t H = c.hidden_size, I = c.moe.moe_intermediate_size, E = c.moe.num_experts;
  s.push_back({mlp_name(c, l, "gate.weight"), {E, H}, false});
  for (int64_t e = 0; e < E; ++e) {
    s.push_back({expert_name(c, l, e, "gate_proj"), {I, H}, false});
    s.push_back({expert_name(c, l, e, "up_proj"), {I, H}, false});
    s.push_back({expert_name(c, l, e, "down_proj"), {H, I}, false});
  }
}

ops::MoeWeights load_moe_layer(const ModelConfig& c, int64_t l, const Checkpoint* ckpt, Device device,
                               std::vector<Buffer>& storage, const StackedLoad& stacked,
                               const LinearLoad& linear) {
  const int64_t H = c.hidden_size, I = c.moe.moe_intermediate_size, E = c.moe.num_experts;
  KILN_CHECK(c.is_moe_layer(l), "layer ", l, " has no sparse MLP");
  ops::MoeWeights w;
  w.top_k = c.moe.num_experts_per_tok;
  w.norm_topk_prob = c.moe.norm_topk_prob;
  w.router = stacked({{mlp_name(c, l, "gate.weight"), E}}, H);
  const std::string fused_gate_up = mlp_name(c, l, "experts.gate_up_proj");
  if (ckpt && ckpt->has(fused_gate_up)) {
    KILN_CHECK(!c.quant.fp8(), "block-FP8 experts are read from the hub layout only; '", fused_gate_up,
               "' is the fused one (save the checkpoint with save_original_format=True)");
    w.gate_up = load_fused(*ckpt, fused_gate_up, E, 2 * I, H, device, storage);
    w.down = load_fused(*ckpt, mlp_name(c, l, "experts.down_proj"), E, H, I, device, storage);
    return w;
  }
  std::vector<std::pair<std::string, int64_t>> gate_up, down;
  for (int64_t e = 0; e < E; ++e) {
    gate_up.emplace_back(expert_name(c, l, e, "gate_proj"), I);
    gate_up.emplace_back(expert_name(c, l, e, "up_proj"), I);
    down.emplace_back(expert_name(c, l, e, "down_proj"), H);
  }
  const bool fp8 = c.quant.fp8();
  if (fp8) check_fp8_expert_widths(l, I, H);
  set_stacked_experts(w, linear(gate_up, H), linear(down, I), l);
  return w;
}

void check_fp8_expert_widths(int64_t l, int64_t I, int64_t H) {
  KILN_CHECK(I % ops::kFp8Block == 0 && H % ops::kFp8Block == 0, "layer ", l,
             ": block-FP8 experts need moe_intermediate_size (", I, ") and hidden_size (", H,
             ") multiples of 128, so each expert's gate, up and down rows fill whole 128-row scale blocks");
}

void set_stacked_experts(ops::MoeWeights& w, const ops::LinearWeight& gu, const ops::LinearWeight& dn,
                         int64_t l) {
  KILN_CHECK(gu.is_fp8() == dn.is_fp8(), "layer ", l, ": the experts' gate/up and down projections must be ",
             "all block-FP8 or all bf16");
  const int64_t H = gu.weight.shape[1], I = dn.weight.shape[1], L = dn.weight.shape[0] / H;
  // [L * 2I, H] and [L * H, I] row stacks are the [L, 2I, H] and [L, H, I] layouts (with FP8, the scales'
  // [L * 2I / 128, ceil(H/128)] and [L * H / 128, ceil(I/128)] are [L, 2I/128, .] and [L, H/128, .]).
  w.gate_up = gu.weight.reshape({L, 2 * I, H});
  w.down = dn.weight.reshape({L, H, I});
  if (gu.is_fp8()) {
    w.gate_up_scale = gu.scale.reshape({L, 2 * I / ops::kFp8Block, gu.scale.shape[1]});
    w.down_scale = dn.scale.reshape({L, H / ops::kFp8Block, dn.scale.shape[1]});
  }
}

}  // namespace kiln
