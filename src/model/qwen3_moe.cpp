#include "model/qwen3_moe.h"

#include <algorithm>
#include <map>
#include <memory>

#include "kiln/error.h"
#include "ops/cpu/parallel.h"
#include "ops/fp8_linear.h"

namespace kiln {
namespace {

std::string mlp_name(const ModelConfig& c, int64_t l, const std::string& leaf) {
  return c.weight_prefix + "layers." + std::to_string(l) + ".mlp." + leaf;
}
std::string expert_name(const ModelConfig& c, int64_t l, int64_t e, const char* proj) {
  return mlp_name(c, l, "experts." + std::to_string(e) + "." + proj + ".weight");
}

std::vector<int64_t> dims(std::initializer_list<int64_t> d) {
  return std::vector<int64_t>(d);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string t = "[";
  for (size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
  return t + "]";
}

// dst[c * dst_stride + r] = src[r * src_stride + c] for r < rows, c < cols, through a 64 x 64 tile in L1:
// its rows read and its columns written contiguously, so neither side walks the other's stride element by
// element (a 4 KB stride, 2048 bf16, would put every line of a direct tile walk into one cache set).
void transpose(const bf16_t* src, int64_t src_stride, bf16_t* dst, int64_t dst_stride, int64_t rows,
               int64_t cols) {
  constexpr int64_t kTile = 64;
  bf16_t tile[kTile][kTile];
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t nr = std::min(kTile, rows - r0);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t nc = std::min(kTile, cols - c0);
      for (int64_t r = 0; r < nr; ++r) std::copy_n(src + (r0 + r) * src_stride + c0, nc, tile[r]);
      for (int64_t c = 0; c < nc; ++c) {
        bf16_t* d = dst + (c0 + c) * dst_stride + r0;
        for (int64_t r = 0; r < nr; ++r) d[r] = tile[r][c];
      }
    }
  }
}

// Sparse layer l's experts from a fused layout onto `device`: bf16 (on the CPU read straight into the
// weights' buffers), or block-FP8 quantized on the host where --quantization fp8 asks (each expert's [2I, H]
// and [H, I] one part: with I and H multiples of 128 the same blocks, so the same bytes, as its gate, up and
// down quantized one by one).
void load_fused_experts(const ModelConfig& c, int64_t l, const Checkpoint& ckpt, ExpertLayout layout,
                        Device device, std::vector<Buffer>& storage, ops::MoeWeights& w) {
  const int64_t H = c.hidden_size, I = c.moe.moe_intermediate_size, E = c.moe.num_experts;
  const size_t n_gate_up = size_t(E * 2 * I * H), n_down = size_t(E * H * I);
  const auto place = [&](Buffer buf, std::initializer_list<int64_t> shape) {
    const Tensor t = buf.view(DType::bf16, shape);
    storage.push_back(std::move(buf));
    return t;
  };
  const bool fp8 = c.quant.online && !fp8_module_excluded(c.quant, expert_name(c, l, 0, "gate_proj"));
  if (!fp8 && !device.is_cuda()) {
    Buffer gu(n_gate_up * sizeof(bf16_t), device), dn(n_down * sizeof(bf16_t), device);
    read_fused_experts(c, l, ckpt, layout, 0, E, 0, I, static_cast<bf16_t*>(gu.data()),
                       static_cast<bf16_t*>(dn.data()));
    w.gate_up = place(std::move(gu), {E, 2 * I, H});
    w.down = place(std::move(dn), {E, H, I});
    return;
  }
  const auto gu_host = std::make_unique_for_overwrite<bf16_t[]>(n_gate_up);
  const auto dn_host = std::make_unique_for_overwrite<bf16_t[]>(n_down);
  read_fused_experts(c, l, ckpt, layout, 0, E, 0, I, gu_host.get(), dn_host.get());
  if (!fp8) {
    Buffer gu(n_gate_up * sizeof(bf16_t), device), dn(n_down * sizeof(bf16_t), device);
    copy_bytes(gu.data(), device, gu_host.get(), Device::cpu(), n_gate_up * sizeof(bf16_t));
    copy_bytes(dn.data(), device, dn_host.get(), Device::cpu(), n_down * sizeof(bf16_t));
    w.gate_up = place(std::move(gu), {E, 2 * I, H});
    w.down = place(std::move(dn), {E, H, I});
    return;
  }
  KILN_CHECK(I % ops::kFp8Block == 0 && H % ops::kFp8Block == 0, "layer ", l,
             ": block-FP8 experts need moe_intermediate_size (", I, ") and hidden_size (", H,
             ") multiples of 128, so each expert's gate, up and down rows fill whole 128-row scale blocks");
  // E parts of rows x cols each, expert e's named "<tensor>[e]", quantized on the GPU as the per-expert path
  // does (bitwise the host quantizer) or on the host.
  const auto quantize = [&](const bf16_t* host, const char* tensor, int64_t rows, int64_t cols) {
    std::vector<std::string> names;
    for (int64_t e = 0; e < E; ++e)
      names.push_back(mlp_name(c, l, std::string("experts.") + tensor + "[" + std::to_string(e) + "]"));
    if (device.is_cuda() && fp8_quantize_on_gpu()) {
      const size_t part_bytes = size_t(rows * cols) * sizeof(bf16_t);
      return quantize_fp8_stack_on_device(
          names, std::vector<int64_t>(size_t(E), rows), cols,
          [&](size_t e, void* dst) {
            copy_bytes(dst, device, host + int64_t(e) * rows * cols, Device::cpu(), part_bytes);
          },
          device, storage);
    }
    std::vector<Fp8HostPart> parts;
    for (int64_t e = 0; e < E; ++e)
      parts.push_back(quantize_fp8_part(host + e * rows * cols, rows, cols, names[size_t(e)]));
    return place_fp8_experts(parts, names, device, storage);
  };
  const ops::LinearWeight gu = quantize(gu_host.get(), "gate_up_proj", 2 * I, H);
  const ops::LinearWeight dn = quantize(dn_host.get(), "down_proj", H, I);
  w.gate_up = gu.weight.reshape({E, 2 * I, H});
  w.down = dn.weight.reshape({E, H, I});
  w.gate_up_scale = gu.scale.reshape({E, 2 * I / ops::kFp8Block, gu.scale.shape[1]});
  w.down_scale = dn.scale.reshape({E, H / ops::kFp8Block, dn.scale.shape[1]});
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

ExpertLayout checkpoint_expert_layout(const ModelConfig& c, int64_t l, const Checkpoint& ckpt) {
  const int64_t H = c.hidden_size, I = c.moe.moe_intermediate_size, E = c.moe.num_experts;
  const std::string gu = mlp_name(c, l, "experts.gate_up_proj"), dn = mlp_name(c, l, "experts.down_proj");
  const bool has_gu = ckpt.has(gu), has_dn = ckpt.has(dn);
  if (!has_gu && !has_dn) return ExpertLayout::per_expert;
  KILN_CHECK(has_gu && has_dn, "checkpoint has '", has_gu ? gu : dn, "' but no '", has_gu ? dn : gu,
             "' (fused experts come as that pair)");
  for (const std::string& name : {gu, dn}) {
    const TensorEntry& t = ckpt.entry(name);
    KILN_CHECK(t.dtype == DType::bf16, "fused expert tensor '", name, "' is ",
               safetensors_dtype_name(t.dtype),
               ": fused experts are read as bf16 only (block-FP8 experts are read per expert, ",
               "L.mlp.experts.e.{gate,up,down}_proj.weight with weight_scale_inv, as Qwen's -FP8 releases "
               "ship them)");
  }
  const std::vector<int64_t>& gs = ckpt.entry(gu).shape;
  const std::vector<int64_t>& ds = ckpt.entry(dn).shape;
  const bool gate_up_fused = gs == dims({E, 2 * I, H}), gate_up_transposed = gs == dims({E, H, 2 * I});
  if (gate_up_fused && ds == dims({E, H, I})) return ExpertLayout::fused;
  if (gate_up_transposed && ds == dims({E, I, H})) return ExpertLayout::fused_transposed;
  const bool blame_down = gate_up_fused || gate_up_transposed;
  KILN_FAIL("fused expert tensor '", blame_down ? dn : gu, "' is ", shape_text(blame_down ? ds : gs),
            "; with num_experts ", E, ", hidden_size ", H, " and moe_intermediate_size ", I,
            " kiln reads gate_up_proj ", shape_text({E, 2 * I, H}), " with down_proj ", shape_text({E, H, I}),
            " (transformers 5) or gate_up_proj ", shape_text({E, H, 2 * I}), " with down_proj ",
            shape_text({E, I, H}), " (Qwen3-VL-MoE as the hub ships it)");
}

void read_fused_experts(const ModelConfig& c, int64_t l, const Checkpoint& ckpt, ExpertLayout layout,
                        int64_t e0, int64_t e1, int64_t i0, int64_t i1, bf16_t* gate_up, bf16_t* down) {
  const int64_t H = c.hidden_size, I = c.moe.moe_intermediate_size, E = c.moe.num_experts;
  KILN_CHECK(
      layout != ExpertLayout::per_expert && 0 <= e0 && e0 < e1 && e1 <= E && 0 <= i0 && i0 < i1 && i1 <= I,
      "read_fused_experts: experts [", e0, ", ", e1, ") intermediate [", i0, ", ", i1, ") of ", E, " x ", I);
  const bool transposed = layout == ExpertLayout::fused_transposed;
  const std::string gu_name = mlp_name(c, l, "experts.gate_up_proj"),
                    dn_name = mlp_name(c, l, "experts.down_proj");
  const Tensor gu = transposed ? ckpt.get(gu_name, DType::bf16, {E, H, 2 * I})
                               : ckpt.get(gu_name, DType::bf16, {E, 2 * I, H});
  const Tensor dn =
      transposed ? ckpt.get(dn_name, DType::bf16, {E, I, H}) : ckpt.get(dn_name, DType::bf16, {E, H, I});
  const int64_t L = e1 - e0, Ir = i1 - i0;
  ops::cpu::parallel_for(L, 1, [&](int64_t a, int64_t b) {
    for (int64_t e = a; e < b; ++e) {
      const bf16_t* g = gu.ptr<bf16_t>() + (e0 + e) * 2 * I * H;
      const bf16_t* d = dn.ptr<bf16_t>() + (e0 + e) * H * I;
      bf16_t* og = gate_up + e * 2 * Ir * H;
      bf16_t* od = down + e * H * Ir;
      for (int64_t half = 0; half < 2; ++half) {  // gate, then up
        bf16_t* out = og + half * Ir * H;
        if (transposed)  // [H, 2I]: column half * I + i is row i of this half
          transpose(g + half * I + i0, 2 * I, out, H, H, Ir);
        else
          std::copy(g + (half * I + i0) * H, g + (half * I + i1) * H, out);
      }
      if (transposed)  // [I, H] rows i0..i1 -> [H, Ir]
        transpose(d + i0 * H, H, od, Ir, Ir, H);
      else
        for (int64_t r = 0; r < H; ++r) std::copy(d + r * I + i0, d + r * I + i1, od + r * Ir);
    }
  });
}

std::vector<NamedTensor> fuse_checkpoint_experts(const ModelConfig& c, const std::vector<NamedTensor>& in,
                                                 ExpertLayout layout,
                                                 std::deque<std::vector<bf16_t>>& storage) {
  KILN_CHECK(layout != ExpertLayout::per_expert, "fuse_checkpoint_experts: a fused layout is needed");
  const int64_t H = c.hidden_size, I = c.moe.moe_intermediate_size, E = c.moe.num_experts;
  const bool transposed = layout == ExpertLayout::fused_transposed;
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : in) by_name[t.name] = &t;
  const auto find = [&](const std::string& name, std::initializer_list<int64_t> shape) {
    const auto it = by_name.find(name);
    KILN_CHECK(it != by_name.end(), "fuse_checkpoint_experts: no '", name, "'");
    const Tensor& t = it->second->tensor;
    KILN_CHECK(
        t.dtype == DType::bf16 && t.is_contiguous() && t.numel() == shape.begin()[0] * shape.begin()[1],
        "fuse_checkpoint_experts: '", name, "' is not bf16 ", shape_text(dims(shape)));
    return t.ptr<bf16_t>();
  };
  std::vector<NamedTensor> out;
  std::vector<bool> done(size_t(c.num_layers), false);
  for (const NamedTensor& t : in) {
    int64_t l = -1;
    for (int64_t k = 0; k < c.num_layers && l < 0; ++k)
      if (c.is_moe_layer(k) && t.name.rfind(mlp_name(c, k, "experts."), 0) == 0) l = k;
    if (l < 0) {
      out.push_back(t);
      continue;
    }
    if (done[size_t(l)]) continue;
    done[size_t(l)] = true;
    std::vector<bf16_t>& gu = storage.emplace_back(size_t(E * 2 * I * H));
    std::vector<bf16_t>& dn = storage.emplace_back(size_t(E * H * I));
    for (int64_t e = 0; e < E; ++e) {
      const bf16_t* gate = find(expert_name(c, l, e, "gate_proj"), {I, H});
      const bf16_t* up = find(expert_name(c, l, e, "up_proj"), {I, H});
      const bf16_t* down = find(expert_name(c, l, e, "down_proj"), {H, I});
      bf16_t* g = gu.data() + e * 2 * I * H;
      if (transposed) {  // [H, 2I]: gate in columns [0, I), up in [I, 2I); down [I, H]
        transpose(gate, H, g, 2 * I, I, H);
        transpose(up, H, g + I, 2 * I, I, H);
        transpose(down, I, dn.data() + e * H * I, H, H, I);
      } else {
        std::copy(gate, gate + I * H, g);
        std::copy(up, up + I * H, g + I * H);
        std::copy(down, down + H * I, dn.data() + e * H * I);
      }
    }
    const std::initializer_list<int64_t> gs = {E, transposed ? H : 2 * I, transposed ? 2 * I : H};
    const std::initializer_list<int64_t> ds = {E, transposed ? I : H, transposed ? H : I};
    out.push_back({mlp_name(c, l, "experts.gate_up_proj"), Tensor(gu.data(), DType::bf16, gs)});
    out.push_back({mlp_name(c, l, "experts.down_proj"), Tensor(dn.data(), DType::bf16, ds)});
  }
  return out;
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
  if (const ExpertLayout layout = ckpt ? checkpoint_expert_layout(c, l, *ckpt) : ExpertLayout::per_expert;
      layout != ExpertLayout::per_expert) {
    load_fused_experts(c, l, *ckpt, layout, device, storage, w);
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
