#include "model/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kiln/error.h"
#include "model/fp8_weights.h"
#include "model/qwen3_moe.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/rms_norm.h"
#include "ops/stream.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kiln/cuda_check.h"
#endif

namespace kiln {

ModelConfig shard_config(const ModelConfig& c, const dist::ShardPlan& p) {
  ModelConfig s = c;
  s.num_heads = p.q_heads.size();
  s.num_kv_heads = p.kv_heads.size();
  s.intermediate_size = p.intermediate.size();
  s.moe.moe_intermediate_size = p.moe_intermediate.size();
  return s;
}

namespace {

using dist::Range;

std::string layer_name(const ModelConfig& c, int64_t l, const char* leaf) {
  return c.weight_prefix + "layers." + std::to_string(l) + "." + leaf;
}

constexpr size_t kStagingBytes = size_t(16) << 20;

// One slice of a checkpoint tensor [rows, cols] (cols 0: a vector): rows r, columns k.
struct Part {
  std::string name;
  int64_t rows = 0, cols = 0;
  Range r, k;
  bool norm = false;
};

// A block-FP8 part's slice: rows p.r, columns p.k of the whole matrix, cut on the 128 x 128 block grid so
// each block keeps its own scale (a boundary inside a block would need the block requantized: refused,
// naming the tensor).
Fp8HostPart slice_fp8_part(const Fp8HostPart& full, const Part& p) {
  const auto on_grid = [](const Range& r, int64_t n) {
    return r.begin % ops::kFp8Block == 0 && (r.end % ops::kFp8Block == 0 || r.end == n);
  };
  KILN_CHECK(on_grid(p.r, full.rows) && on_grid(p.k, full.cols), "tensor parallelism cuts '", p.name, "' [",
             full.rows, ", ", full.cols, "] at rows [", p.r.begin, ", ", p.r.end, ") and columns [",
             p.k.begin, ", ", p.k.end,
             "), inside its 128 x 128 FP8 blocks: block-FP8 weights need every rank's slice ",
             "of heads and of intermediate_size to be a multiple of 128 (use a smaller --tp)");
  Fp8HostPart s;
  s.rows = p.r.size();
  s.cols = p.k.size();
  s.owned.resize(size_t(s.rows * s.cols));
  for (int64_t i = 0; i < s.rows; ++i)
    std::memcpy(s.owned.data() + i * s.cols, full.q + (p.r.begin + i) * full.cols + p.k.begin,
                size_t(s.cols));
  s.q = s.owned.data();
  const int64_t kb_full = ops::fp8_blocks(full.cols), rb0 = p.r.begin / ops::kFp8Block,
                kb0 = p.k.begin / ops::kFp8Block, nrb = ops::fp8_blocks(s.rows),
                nkb = ops::fp8_blocks(s.cols);
  s.scale.resize(size_t(nrb * nkb));
  for (int64_t i = 0; i < nrb; ++i)
    for (int64_t j = 0; j < nkb; ++j)
      s.scale[size_t(i * nkb + j)] = full.scale[size_t((rb0 + i) * kb_full + kb0 + j)];
  return s;
}

// Builds the rank's tensors: each a stack of parts, each part written straight to its place in the device
// buffer from the mapping (contiguous rows) or through a bounded staging buffer (a column slice to a GPU).
class ShardLoader {
 public:
  ShardLoader(const ModelConfig& cfg, const Checkpoint* ckpt, uint64_t seed, Device device, Qwen3Weights& w)
      : cfg_(cfg), ckpt_(ckpt), seed_(seed), device_(device), w_(w) {}

  // A projection: the parts stacked as `stacked` does, kept bf16, or block-FP8 by weights.cpp's rule (the
  // checkpoint stores it so, or the config asks for online quantization). An FP8 part is read (or
  // quantized) whole, as the TP = 1 model's, then sliced on the block grid, so a rank's blocks and scales are
  // those of the TP = 1 model. experts: placed as the TP = 1 model's MoE experts (place_fp8_experts: e4m3
  // on every device), else as a dense projection (place_fp8_linear).
  ops::LinearWeight linear(const std::vector<Part>& parts, bool experts = false) {
    size_t stored_fp8 = 0;
    if (ckpt_)
      for (const Part& p : parts) stored_fp8 += stored_as_fp8(p);
    KILN_CHECK(stored_fp8 == 0 || stored_fp8 == parts.size(), "'", parts[0].name, "' and '",
               parts.back().name,
               "' are stacked into one matrix but the checkpoint stores some of them F8_E4M3 and some not");
    const bool online = stored_fp8 == 0 && quantized_online(parts[0]);
    if (stored_fp8 == 0 && !online) return stacked(parts);
    std::vector<Fp8HostPart> host;
    std::vector<std::string> names;
    for (const Part& p : parts) {
      Fp8HostPart full;
      if (stored_fp8) {
        full = read_fp8_part(*ckpt_, p.name, p.rows, p.cols);
      } else if (ckpt_) {
        const Tensor t = ckpt_->get(p.name, DType::bf16, {p.rows, p.cols});
        full = quantize_fp8_part(t.ptr<bf16_t>(), p.rows, p.cols, p.name);
      } else {
        std::vector<bf16_t> random(size_t(p.rows * p.cols));
        fill_random_weight({p.name, {p.rows, p.cols}, false}, seed_, random.data());
        full = quantize_fp8_part(random.data(), p.rows, p.cols, p.name);
      }
      host.push_back(slice_fp8_part(full, p));
      names.push_back(p.name);
    }
    if (experts) return place_fp8_experts(host, names, device_, w_.storage);
    return place_fp8_linear(host, names, device_, w_.storage);
  }

  // Whether the checkpoint stores part p's tensor block-FP8 (weights.cpp's rule).
  bool stored_as_fp8(const Part& p) const {
    return checkpoint_linear_is_fp8(cfg_.quant, *ckpt_, p.name, p.rows, p.cols);
  }
  // Whether a bf16 part is quantized at load (--quantization fp8, or random weights of an FP8 config).
  bool quantized_online(const Part& p) const {
    const QuantConfig& q = cfg_.quant;
    return q.fp8() && (q.online || !ckpt_) && !fp8_module_excluded(q, p.name);
  }

  Tensor stacked(const std::vector<Part>& parts) {
    int64_t rows = 0;
    const int64_t width = parts[0].cols ? parts[0].k.size() : 1;
    for (const Part& p : parts) {
      KILN_CHECK((p.cols ? p.k.size() : 1) == width, "internal: stacked parts of different widths");
      rows += p.r.size();
    }
    Buffer buf(size_t(rows * width) * sizeof(bf16_t), device_);
    auto* dst = static_cast<bf16_t*>(buf.data());
    for (const Part& p : parts) {
      write(p, dst);
      dst += p.r.size() * width;
    }
#ifdef KILN_HAVE_CUDA
    if (device_.is_cuda()) KILN_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // the random fills
#endif
    Tensor t = parts[0].cols ? buf.view(DType::bf16, {rows, width}) : buf.view(DType::bf16, {rows});
    w_.storage.push_back(std::move(buf));
    return t;
  }
  Tensor matrix(const std::string& name, int64_t rows, int64_t cols, Range r, Range k) {
    return stacked({{name, rows, cols, r, k, false}});
  }
  Tensor vector(const std::string& name, int64_t n) {
    return stacked({{name, n, 0, {0, n}, {0, 1}, true}});
  }

  // Sparse layer l's share (dist/shard_plan.h): the router whole; experts p.experts, each with its gate/up
  // rows and down columns p.moe_intermediate. From the per-expert layout, or a fused one (model/qwen3_moe.h)
  // sliced on the host.
  ops::MoeWeights moe_layer(int64_t l, const dist::ShardPlan& p) {
    const ModelConfig& c = cfg_;
    const int64_t H = c.hidden_size, I = c.moe.moe_intermediate_size, E = c.moe.num_experts;
    const int64_t L = p.experts.size(), Ir = p.moe_intermediate.size();
    const std::string mlp = c.weight_prefix + "layers." + std::to_string(l) + ".mlp.";
    ops::MoeWeights w;
    w.top_k = c.moe.num_experts_per_tok;
    w.norm_topk_prob = c.moe.norm_topk_prob;
    w.expert_begin = p.experts.begin;
    w.split_intermediate = Ir != I;
    w.router = matrix(mlp + "gate.weight", E, H, {0, E}, {0, H});
    if (const ExpertLayout layout = ckpt_ ? checkpoint_expert_layout(c, l, *ckpt_) : ExpertLayout::per_expert;
        layout != ExpertLayout::per_expert) {
      KILN_CHECK(!c.quant.fp8(), "block-FP8 experts under --tp are read from the per-expert layout only; '",
                 mlp, "experts.gate_up_proj' is the fused one (serve the BF16 experts, or at --tp 1)");
      std::vector<bf16_t> gate_up(size_t(L * 2 * Ir * H)), down(size_t(L * H * Ir));
      read_fused_experts(c, l, *ckpt_, layout, p.experts.begin, p.experts.end, p.moe_intermediate.begin,
                         p.moe_intermediate.end, gate_up.data(), down.data());
      w.gate_up = upload(gate_up, L, 2 * Ir, H);
      w.down = upload(down, L, H, Ir);
      return w;
    }
    std::vector<Part> gate_up, down;
    const Range all_h{0, H};
    for (int64_t e = p.experts.begin; e < p.experts.end; ++e) {
      const std::string ex = mlp + "experts." + std::to_string(e) + ".";
      gate_up.push_back({ex + "gate_proj.weight", I, H, p.moe_intermediate, all_h});
      gate_up.push_back({ex + "up_proj.weight", I, H, p.moe_intermediate, all_h});
      down.push_back({ex + "down_proj.weight", H, I, all_h, p.moe_intermediate});
    }
    // Block-FP8 experts are cut on their 128 x 128 grid (slice_fp8_part): each rank's slice of every expert's
    // intermediate must be whole blocks, said here in the config's terms before any expert is read.
    const bool fp8 = (ckpt_ && stored_as_fp8(gate_up[0])) || quantized_online(gate_up[0]);
    KILN_CHECK(!fp8 || Ir == I || Ir % ops::kFp8Block == 0, "block-FP8 experts: moe_intermediate_size (", I,
               ") split over --tp ", p.tp, " leaves ", Ir, " rows a rank, not a multiple of the ",
               ops::kFp8Block, " x ", ops::kFp8Block,
               " FP8 block: use a --tp that divides moe_intermediate_size / 128, or --enable-expert-parallel "
               "(whole experts a rank)");
    if (fp8) check_fp8_expert_widths(l, Ir, H);
    set_stacked_experts(w, linear(gate_up, true), linear(down, true), l);
    return w;
  }

 private:
  void write(const Part& p, bf16_t* dst) {
    const int64_t cols = p.cols ? p.cols : 1, width = p.cols ? p.k.size() : 1;
    const bool whole_rows = width == cols;
    if (!ckpt_) {
      const WeightSpec spec{
          p.name, p.cols ? std::vector<int64_t>{p.rows, p.cols} : std::vector<int64_t>{p.rows}, p.norm};
      // Whole rows are one range of the tensor's elements; a column slice is one range per row.
      const int64_t runs = whole_rows ? 1 : p.r.size(), run = whole_rows ? p.r.size() * cols : width;
      std::vector<bf16_t> host;
      for (int64_t i = 0; i < runs; ++i) {
        const int64_t offset = (p.r.begin + i) * cols + (whole_rows ? 0 : p.k.begin);
        if (device_.is_cuda()) {
          fill_random_weight_range_cuda(spec, seed_, offset, run, dst + i * run);
        } else {
          fill_random_weight_range(spec, seed_, offset, run, dst + i * run);
        }
      }
      return;
    }
    const Tensor t = p.cols ? ckpt_->get(p.name, DType::bf16, {p.rows, p.cols})
                            : ckpt_->get(p.name, DType::bf16, {p.rows});
    if (whole_rows) {
      copy_bytes(dst, device_, t.ptr<bf16_t>() + p.r.begin * cols, Device::cpu(),
                 size_t(p.r.size() * cols) * sizeof(bf16_t));
      return;
    }
    const Tensor rows_view = Tensor::strided(t.ptr<bf16_t>() + p.r.begin * cols, DType::bf16,
                                             {p.r.size(), cols}, {cols, 1}, Device::cpu());
    if (device_.is_cpu()) {
      dist::copy_cols(rows_view, p.k, dst);
      return;
    }
    // To a GPU: a few rows at a time through host staging, never the whole tensor.
    const int64_t chunk = std::max<int64_t>(1, int64_t(kStagingBytes / (size_t(width) * sizeof(bf16_t))));
    std::vector<bf16_t> staging(size_t(std::min(chunk, p.r.size()) * width));
    for (int64_t r0 = 0; r0 < p.r.size(); r0 += chunk) {
      const int64_t n = std::min(chunk, p.r.size() - r0);
      const Tensor piece = Tensor::strided(t.ptr<bf16_t>() + (p.r.begin + r0) * cols, DType::bf16, {n, cols},
                                           {cols, 1}, Device::cpu());
      dist::copy_cols(piece, p.k, staging.data());
      copy_bytes(dst + r0 * width, device_, staging.data(), Device::cpu(),
                 size_t(n * width) * sizeof(bf16_t));
    }
  }

  // host bytes as a [a, b, c] device tensor.
  Tensor upload(const std::vector<bf16_t>& host, int64_t a, int64_t b, int64_t c) {
    Buffer buf(host.size() * sizeof(bf16_t), device_);
    copy_bytes(buf.data(), device_, host.data(), Device::cpu(), host.size() * sizeof(bf16_t));
    Tensor t = buf.view(DType::bf16, {a, b, c});
    w_.storage.push_back(std::move(buf));
    return t;
  }

  const ModelConfig& cfg_;
  const Checkpoint* ckpt_;
  uint64_t seed_;
  Device device_;
  Qwen3Weights& w_;
};

}  // namespace

Qwen3Weights load_qwen3_weights_shard(const ModelConfig& c, const dist::ShardPlan& p, const Checkpoint* ckpt,
                                      uint64_t seed, Device device) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, V = c.vocab_size;
  const int64_t qd = c.num_heads * D, kvd = c.num_kv_heads * D;
  const Range all_h{0, H}, q = p.q_rows(D), kv = p.kv_rows(D);
  Qwen3Weights w;
  ShardLoader ld(c, ckpt, seed, device, w);
  w.embed = ld.matrix(c.weight_prefix + "embed_tokens.weight", V, H, {0, V}, all_h);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    lw.input_norm = ld.vector(layer_name(c, l, "input_layernorm.weight"), H);
    lw.qkv = ld.linear({{layer_name(c, l, "self_attn.q_proj.weight"), qd, H, q, all_h},
                        {layer_name(c, l, "self_attn.k_proj.weight"), kvd, H, kv, all_h},
                        {layer_name(c, l, "self_attn.v_proj.weight"), kvd, H, kv, all_h}});
    lw.q_norm = ld.vector(layer_name(c, l, "self_attn.q_norm.weight"), D);
    lw.k_norm = ld.vector(layer_name(c, l, "self_attn.k_norm.weight"), D);
    lw.o_proj = ld.linear({{layer_name(c, l, "self_attn.o_proj.weight"), H, qd, all_h, q}});
    lw.post_norm = ld.vector(layer_name(c, l, "post_attention_layernorm.weight"), H);
    if (c.is_moe_layer(l)) {
      lw.moe = ld.moe_layer(l, p);
      w.layers.push_back(lw);
      continue;
    }
    lw.gate_up = ld.linear({{layer_name(c, l, "mlp.gate_proj.weight"), I, H, p.intermediate, all_h},
                            {layer_name(c, l, "mlp.up_proj.weight"), I, H, p.intermediate, all_h}});
    lw.down = ld.linear({{layer_name(c, l, "mlp.down_proj.weight"), H, I, all_h, p.intermediate}});
    w.layers.push_back(lw);
  }
  w.final_norm = ld.vector(c.weight_prefix + "norm.weight", H);
  if (c.arch == ModelArch::qwen3_embedding) {
    // An embedding model runs no LM head (load_qwen3_weights): lm_head stays empty.
  } else if (c.tie_word_embeddings) {
    w.lm_head = Tensor(w.embed.ptr<bf16_t>() + p.vocab.begin * H, DType::bf16, {p.vocab.size(), H}, device);
  } else {
    KILN_CHECK(!ckpt || ckpt->has("lm_head.weight"),
               "checkpoint has no lm_head.weight and config.json says tie_word_embeddings is false");
    w.lm_head = ld.matrix("lm_head.weight", V, H, p.vocab, all_h);
  }
  return w;
}

namespace {

void* stream_arg() {
  return ops::current_stream();
}

}  // namespace

void tp_linear_add_rms_norm(const TpShard& tp, const Tensor& x, const ops::LinearWeight& weight,
                            const Tensor& residual, const Tensor& norm_weight, float eps, const Tensor& tmp,
                            const Tensor& partial, const Tensor& normed) {
  const int64_t M = x.shape[0], N = weight.rows();
  if (M == 0) return;
  KILN_CHECK(tmp.is_contiguous(), "tp_linear_add_rms_norm: tmp must be contiguous, got ", tmp.describe());
  if (tp.reduce == dist::ReduceType::bf16) {
    ops::linear(x, weight, tmp);
    tp.comm->all_reduce_sum(tmp.data, size_t(M * N), dist::ReduceType::bf16, stream_arg());
  } else {
    KILN_CHECK(x.device.is_cpu(), "the fp32 tensor-parallel all-reduce runs on the CPU only (CUDA: bf16)");
    KILN_CHECK(partial.dtype == DType::f32 && partial.is_contiguous() && partial.numel() == M * N,
               "tp_linear_add_rms_norm: partial must be contiguous f32 [", M, ", ", N, "], got ",
               partial.describe());
    ops::linear_f32(x, weight, partial);
    tp.comm->all_reduce_sum(partial.data, size_t(M * N), dist::ReduceType::f32, stream_arg());
    const float* src = partial.ptr<float>();
    bf16_t* dst = tmp.ptr<bf16_t>();
    for (int64_t i = 0; i < M * N; ++i) dst[i] = f32_to_bf16(src[i]);  // linear's one rounding point
  }
  ops::add_rms_norm(tmp, residual, norm_weight, eps, normed);
}

void tp_moe_add_rms_norm(const TpShard& tp, const Tensor& x, const ops::MoeWeights& moe,
                         const Tensor& residual, const Tensor& norm_weight, float eps, const Tensor& tmp,
                         const Tensor& partial, const Tensor& normed, const Tensor& scratch) {
  const int64_t M = x.shape[0], N = x.shape[1];
  if (M == 0) return;
  KILN_CHECK(tmp.is_contiguous(), "tp_moe_add_rms_norm: tmp must be contiguous, got ", tmp.describe());
  if (tp.reduce == dist::ReduceType::bf16) {
    ops::moe_mlp(x, moe, tmp, scratch);
    tp.comm->all_reduce_sum(tmp.data, size_t(M * N), dist::ReduceType::bf16, stream_arg());
  } else {
    KILN_CHECK(x.device.is_cpu(), "the fp32 tensor-parallel all-reduce runs on the CPU only (CUDA: bf16)");
    KILN_CHECK(partial.dtype == DType::f32 && partial.is_contiguous() && partial.numel() >= M * N,
               "tp_moe_add_rms_norm: partial must be contiguous f32 of at least [", M, ", ", N, "], got ",
               partial.describe());
    const Tensor part(partial.data, DType::f32, {M, N}, partial.device);
    ops::moe_mlp(x, moe, part);
    tp.comm->all_reduce_sum(part.data, size_t(M * N), dist::ReduceType::f32, stream_arg());
    const float* src = part.ptr<float>();
    bf16_t* dst = tmp.ptr<bf16_t>();
    for (int64_t i = 0; i < M * N; ++i) dst[i] = f32_to_bf16(src[i]);  // moe_mlp's one rounding point
  }
  ops::add_rms_norm(tmp, residual, norm_weight, eps, normed);
}

int64_t tp_gathered_elems(const TpShard& tp, int64_t R) {
  return int64_t(tp.plan.tp) * R * tp.plan.vocab_per_rank;
}

void tp_lm_head(const TpShard& tp, const Tensor& x, const Tensor& rows, const Tensor& weight,
                const Tensor& gathered, const Tensor& logits) {
  const int64_t R = rows.shape[0], V = logits.shape[1], per = tp.plan.vocab_per_rank;
  const int n = tp.plan.tp;
  if (R == 0) return;
  KILN_CHECK(gathered.dtype == DType::f32 && gathered.is_contiguous() && gathered.numel() >= n * R * per,
             "tp_lm_head: gathered must be contiguous f32 [", n, ", ", R, ", ", per, "], got ",
             gathered.describe());
  KILN_CHECK(logits.stride[0] == V && weight.shape[0] == tp.plan.vocab.size(), "tp_lm_head: logits ",
             logits.describe(), " / weight ", weight.describe(), " do not fit the plan");
  float* base = gathered.ptr<float>();
  float* mine = base + int64_t(tp.plan.rank) * R * per;
  ops::lm_head(x, rows, weight,
               Tensor::strided(mine, DType::f32, {R, weight.shape[0]}, {per, 1}, gathered.device));
  tp.comm->all_gather(mine, base, size_t(R * per) * sizeof(float), stream_arg());
  // Rank q's block [R, per] holds vocab columns [q * per, q * per + its rows).
  for (int q = 0; q < n; ++q) {
    const int64_t begin = std::min<int64_t>(V, q * per), cols = std::min<int64_t>(V, (q + 1) * per) - begin;
    if (cols == 0) continue;
    const float* src = base + int64_t(q) * R * per;
    float* dst = logits.ptr<float>() + begin;
    if (logits.device.is_cpu()) {
      for (int64_t r = 0; r < R; ++r) std::memcpy(dst + r * V, src + r * per, size_t(cols) * sizeof(float));
      continue;
    }
#ifdef KILN_HAVE_CUDA
    KILN_CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(V) * sizeof(float), src, size_t(per) * sizeof(float),
                                      size_t(cols) * sizeof(float), size_t(R), cudaMemcpyDeviceToDevice,
                                      static_cast<cudaStream_t>(ops::current_stream())));
#else
    KILN_FAIL("kiln was built without CUDA");
#endif
  }
}

}  // namespace kiln
