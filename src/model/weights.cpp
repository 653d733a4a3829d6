#include "model/weights.h"

#include <cstring>

#include "kiln/error.h"
#include "model/fp8_weights.h"
#include "model/qwen3_moe.h"
#include "ops/cpu/parallel.h"

namespace kiln {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string layer_name(const ModelConfig& cfg, int64_t l, const char* leaf) {
  return cfg.weight_prefix + "layers." + std::to_string(l) + "." + leaf;
}

// Builds one device tensor of `rows` x `cols` from the named parts stacked along rows.
class Loader {
 public:
  Loader(const ModelConfig& cfg, const Checkpoint* ckpt, uint64_t seed, Device device, Qwen3Weights& w)
      : cfg_(cfg), ckpt_(ckpt), seed_(seed), device_(device), w_(w) {}

  // parts: (name, rows) stacked in order; cols = 0 for a 1-D tensor.
  Tensor stacked(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols, bool norm) {
    int64_t rows = 0;
    for (const auto& p : parts) rows += p.second;
    const int64_t row_elems = cols ? cols : 1;
    Buffer buf(size_t(rows * row_elems) * sizeof(bf16_t), device_);
    int64_t row0 = 0;
    std::vector<bf16_t> host;
    for (const auto& [name, prows] : parts) {
      const int64_t n = prows * row_elems;
      char* dst = static_cast<char*>(buf.data()) + row0 * row_elems * int64_t(sizeof(bf16_t));
      if (ckpt_) {
        const Tensor t =
            cols ? ckpt_->get(name, DType::bf16, {prows, cols}) : ckpt_->get(name, DType::bf16, {prows});
        copy_bytes(dst, device_, t.data, Device::cpu(), size_t(n) * sizeof(bf16_t));
      } else {
        WeightSpec spec{name, cols ? std::vector<int64_t>{prows, cols} : std::vector<int64_t>{prows}, norm};
        if (device_.is_cuda()) {  // generated on the GPU: no host pass over multi-GB weights
          fill_random_weight_cuda(spec, seed_, dst);
          row0 += prows;
          continue;
        }
        host.resize(size_t(n));
        fill_random_weight(spec, seed_, host.data());
        copy_bytes(dst, device_, host.data(), Device::cpu(), size_t(n) * sizeof(bf16_t));
      }
      row0 += prows;
    }
    Tensor t = cols ? buf.view(DType::bf16, {rows, cols}) : buf.view(DType::bf16, {rows});
    w_.storage.push_back(std::move(buf));
    return t;
  }
  Tensor matrix(const std::string& name, int64_t rows, int64_t cols) {
    return stacked({{name, rows}}, cols, false);
  }
  Tensor vector(const std::string& name, int64_t n) { return stacked({{name, n}}, 0, true); }

  // A projection: the parts stacked as `stacked` does, kept bf16, or block-FP8 where the checkpoint stores
  // them so (all parts alike) or the config asks for online quantization.
  ops::LinearWeight linear(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols) {
    const Fp8Source source = fp8_source(parts, cols);
    if (source == Fp8Source::none) return stacked(parts, cols, false);
    if (source == Fp8Source::online && device_.is_cuda() && fp8_quantize_on_gpu()) {
      std::vector<int64_t> rows;
      int64_t total = 0;
      for (const auto& part : parts) rows.push_back(part.second), total += part.second;
      if (fp8_stack_stays_fp8(rows, device_)) {
        const ops::LinearWeight w = quantize_on_device(parts, cols);
        reserve_fp8_gemm_buffers(device_, total, cols);
        return w;
      }
    }
    std::vector<Fp8HostPart> host;
    std::vector<std::string> names;
    fp8_parts(parts, cols, source, host, names);
    return place_fp8_linear(host, names, device_, w_.storage);
  }
  // The same for MoE experts, whose FP8 form stays e4m3 on every device (the expert kernels widen it). Online
  // quantization onto a GPU runs there: random values generated in place, checkpoint bf16 copied up, each
  // part quantized by a kernel (bitwise the host quantizer), where the host took minutes over 30B-A3B's
  // 29 G expert weights.
  ops::LinearWeight expert_linear(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols) {
    const Fp8Source source = fp8_source(parts, cols);
    if (source == Fp8Source::none) return stacked(parts, cols, false);
    if (source == Fp8Source::online && device_.is_cuda() && fp8_quantize_on_gpu())
      return quantize_on_device(parts, cols);
    std::vector<Fp8HostPart> host;
    std::vector<std::string> names;
    fp8_parts(parts, cols, source, host, names);
    return place_fp8_experts(host, names, device_, w_.storage);
  }

 private:
  // Online quantization of the parts on the GPU (quantize_fp8_stack_on_device): random values generated
  // there, checkpoint bf16 copied up.
  ops::LinearWeight quantize_on_device(const std::vector<std::pair<std::string, int64_t>>& parts,
                                       int64_t cols) {
    std::vector<std::string> names;
    std::vector<int64_t> rows;
    for (const auto& [name, r] : parts) names.push_back(name), rows.push_back(r);
    return quantize_fp8_stack_on_device(
        names, rows, cols,
        [&](size_t i, void* dst) {
          if (ckpt_) {
            const Tensor t = ckpt_->get(names[i], DType::bf16, {rows[i], cols});
            copy_bytes(dst, device_, t.data, Device::cpu(), size_t(t.nbytes()));
          } else {
            fill_random_weight_cuda({names[i], {rows[i], cols}, false}, seed_, dst);
          }
        },
        device_, w_.storage);
  }

  // Where a projection's block-FP8 data comes from: none (it stays bf16), the checkpoint's F8_E4M3 tensors,
  // or online quantization (--quantization fp8 on a bf16 checkpoint, or random weights for an FP8 config).
  enum class Fp8Source { none, stored, online };
  Fp8Source fp8_source(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols) const {
    const QuantConfig& q = cfg_.quant;
    size_t stored_fp8 = 0;
    if (ckpt_)
      for (const auto& [name, rows] : parts)
        stored_fp8 += checkpoint_linear_is_fp8(q, *ckpt_, name, rows, cols);
    KILN_CHECK(stored_fp8 == 0 || stored_fp8 == parts.size(), "'", parts[0].first, "' and '",
               parts.back().first,
               "' are stacked into one matrix but the checkpoint stores some of them F8_E4M3 and some not");
    if (stored_fp8) return Fp8Source::stored;
    const bool online = q.fp8() && (q.online || !ckpt_) && !fp8_module_excluded(q, parts[0].first);
    return online ? Fp8Source::online : Fp8Source::none;
  }
  // The parts' block-FP8 host data, read (stored) or quantized on the host (online).
  void fp8_parts(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols, Fp8Source source,
                 std::vector<Fp8HostPart>& host, std::vector<std::string>& names) {
    std::vector<bf16_t> random;
    for (const auto& [name, rows] : parts) {
      names.push_back(name);
      if (source == Fp8Source::stored) {
        host.push_back(read_fp8_part(*ckpt_, name, rows, cols));
      } else if (ckpt_) {
        const Tensor t = ckpt_->get(name, DType::bf16, {rows, cols});
        host.push_back(quantize_fp8_part(t.ptr<bf16_t>(), rows, cols, name));
      } else {
        random.resize(size_t(rows * cols));
        fill_random_weight({name, {rows, cols}, false}, seed_, random.data());
        host.push_back(quantize_fp8_part(random.data(), rows, cols, name));
      }
    }
  }

 private:
  const ModelConfig& cfg_;
  const Checkpoint* ckpt_;
  uint64_t seed_;
  Device device_;
  Qwen3Weights& w_;
};

void check_config(const ModelConfig& c) {
  KILN_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_layers > 0 &&
                 c.num_heads > 0 && c.num_kv_heads > 0 && c.head_dim > 0,
             "model config has a non-positive size");
  KILN_CHECK(c.num_heads % c.num_kv_heads == 0, "num_attention_heads ", c.num_heads,
             " is not a multiple of num_key_value_heads ", c.num_kv_heads);
}

}  // namespace

std::vector<WeightSpec> qwen3_weight_specs(const ModelConfig& c) {
  check_config(c);
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  std::vector<WeightSpec> s;
  s.push_back({c.weight_prefix + "embed_tokens.weight", {c.vocab_size, H}, false});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    s.push_back({layer_name(c, l, "input_layernorm.weight"), {H}, true});
    s.push_back({layer_name(c, l, "self_attn.q_proj.weight"), {c.num_heads * D, H}, false});
    s.push_back({layer_name(c, l, "self_attn.k_proj.weight"), {c.num_kv_heads * D, H}, false});
    s.push_back({layer_name(c, l, "self_attn.v_proj.weight"), {c.num_kv_heads * D, H}, false});
    s.push_back({layer_name(c, l, "self_attn.o_proj.weight"), {H, c.num_heads * D}, false});
    s.push_back({layer_name(c, l, "self_attn.q_norm.weight"), {D}, true});
    s.push_back({layer_name(c, l, "self_attn.k_norm.weight"), {D}, true});
    s.push_back({layer_name(c, l, "post_attention_layernorm.weight"), {H}, true});
    if (c.is_moe_layer(l)) {
      append_moe_layer_specs(c, l, s);
      continue;
    }
    s.push_back({layer_name(c, l, "mlp.gate_proj.weight"), {I, H}, false});
    s.push_back({layer_name(c, l, "mlp.up_proj.weight"), {I, H}, false});
    s.push_back({layer_name(c, l, "mlp.down_proj.weight"), {H, I}, false});
  }
  s.push_back({c.weight_prefix + "norm.weight", {H}, true});
  if (!c.tie_word_embeddings && c.arch != ModelArch::qwen3_embedding) {
    s.push_back({"lm_head.weight", {c.vocab_size, H}, false});
  }
  return s;
}

RandomWeightParams random_weight_params(const WeightSpec& spec, uint64_t seed) {
  // uniform std = half_width / sqrt(3)
  return {splitmix64(seed ^ fnv1a(spec.name)), spec.norm ? 1.0f : 0.0f,
          spec.norm ? 0.1f : 0.02f * 1.7320508f};
}

void fill_random_weight(const WeightSpec& spec, uint64_t seed, bf16_t* out) {
  fill_random_weight_range(spec, seed, 0, numel_of(spec.shape), out);
}

void fill_random_weight_range(const WeightSpec& spec, uint64_t seed, int64_t offset, int64_t n, bf16_t* out) {
  KILN_CHECK(offset >= 0 && n >= 0 && offset + n <= numel_of(spec.shape), "fill_random_weight_range: [",
             offset, ", ", offset + n, ") outside ", spec.name);
  const RandomWeightParams rp = random_weight_params(spec, seed);
  const uint64_t key = rp.key + uint64_t(offset);
  const float half_width = rp.half_width, center = rp.center;
  ops::cpu::parallel_for(n, 1 << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const uint64_t r = splitmix64(key + uint64_t(i));
      const float u = float(r >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
      out[i] = f32_to_bf16(center + (2.0f * u - 1.0f) * half_width);
    }
  });
}

RandomWeights random_weights(const std::vector<WeightSpec>& specs, uint64_t seed) {
  RandomWeights w;
  w.data.reserve(specs.size());  // the tensors point into these vectors: no reallocation
  for (const WeightSpec& spec : specs) {
    const int64_t n = numel_of(spec.shape);
    w.data.emplace_back(static_cast<size_t>(n));
    fill_random_weight(spec, seed, w.data.back().data());
    Tensor t(w.data.back().data(), DType::bf16, {n});
    t.ndim = int(spec.shape.size());
    int64_t stride = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      t.shape[size_t(i)] = spec.shape[size_t(i)];
      t.stride[size_t(i)] = stride;
      stride *= spec.shape[size_t(i)];
    }
    w.tensors.push_back({spec.name, t});
  }
  return w;
}

Qwen3Weights load_qwen3_weights(const ModelConfig& c, const Checkpoint* ckpt, uint64_t seed, Device device) {
  check_config(c);
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t qd = c.num_heads * D, kvd = c.num_kv_heads * D;
  Qwen3Weights w;
  Loader ld(c, ckpt, seed, device, w);
  w.embed = ld.matrix(c.weight_prefix + "embed_tokens.weight", c.vocab_size, H);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    lw.input_norm = ld.vector(layer_name(c, l, "input_layernorm.weight"), H);
    lw.qkv = ld.linear({{layer_name(c, l, "self_attn.q_proj.weight"), qd},
                        {layer_name(c, l, "self_attn.k_proj.weight"), kvd},
                        {layer_name(c, l, "self_attn.v_proj.weight"), kvd}},
                       H);
    lw.q_norm = ld.vector(layer_name(c, l, "self_attn.q_norm.weight"), D);
    lw.k_norm = ld.vector(layer_name(c, l, "self_attn.k_norm.weight"), D);
    lw.o_proj = ld.linear({{layer_name(c, l, "self_attn.o_proj.weight"), H}}, qd);
    lw.post_norm = ld.vector(layer_name(c, l, "post_attention_layernorm.weight"), H);
    if (c.is_moe_layer(l)) {
      lw.moe = load_moe_layer(
          c, l, ckpt, device, w.storage,
          [&](const auto& parts, int64_t cols) { return ld.stacked(parts, cols, false); },
          [&](const auto& parts, int64_t cols) { return ld.expert_linear(parts, cols); });
      w.layers.push_back(lw);
      continue;
    }
    lw.gate_up = ld.linear(
        {{layer_name(c, l, "mlp.gate_proj.weight"), I}, {layer_name(c, l, "mlp.up_proj.weight"), I}}, H);
    lw.down = ld.linear({{layer_name(c, l, "mlp.down_proj.weight"), H}}, I);
    w.layers.push_back(lw);
  }
  w.final_norm = ld.vector(c.weight_prefix + "norm.weight", H);
  if (c.arch == ModelArch::qwen3_embedding) {
    // An embedding model never runs the LM head (forward_hidden): lm_head stays empty, tied or not, even
    // where the checkpoint holds lm_head.weight (a generation checkpoint served with --is-embedding).
  } else if (c.tie_word_embeddings) {
    w.lm_head = w.embed;
  } else {
    KILN_CHECK(!ckpt || ckpt->has("lm_head.weight"),
               "checkpoint has no lm_head.weight and config.json says tie_word_embeddings is false");
    w.lm_head = ld.matrix("lm_head.weight", c.vocab_size, H);
  }
  return w;
}

}  // namespace kiln
