#include "model/qwen3_vl_vision.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kiln/error.h"
#include "model/qwen3_vl_prompt.h"
#include "ops/activation.h"
#include "ops/layer_norm.h"
#include "ops/linear.h"
#include "ops/rows.h"
#include "ops/vision_attention.h"
#include "ops/vision_pos_embed.h"

namespace kiln {
namespace {

constexpr const char* kPrefix = "model.visual.";
constexpr float kNormEps = 1e-6f;  // every LayerNorm of the tower (transformers hard-codes it)
constexpr double kRopeTheta = 10000.0;

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Tensors on `device`, one Buffer each, from the checkpoint or the seeded generator.
class Loader {
 public:
  Loader(const Checkpoint* ckpt, uint64_t seed, Device device, VisionWeights& w)
      : ckpt_(ckpt), seed_(seed), device_(device), w_(w) {}
  // Loads `spec` and returns it viewed as `view` (same number of elements).
  Tensor load(const WeightSpec& spec, std::initializer_list<int64_t> view) {
    const int64_t n = numel_of(spec.shape);
    Buffer buf(size_t(n) * sizeof(bf16_t), device_);
    if (ckpt_) {
      KILN_CHECK(ckpt_->has(spec.name), "checkpoint has no '", spec.name,
                 "' (a Qwen3-VL checkpoint carries its vision tower under model.visual.)");
      const Tensor t = ckpt_->get(spec.name);
      KILN_CHECK(t.dtype == DType::bf16, "'", spec.name, "' must be bf16, got ", t.describe());
      bool same = t.ndim == int(spec.shape.size());
      for (int i = 0; same && i < t.ndim; ++i) same = t.shape[size_t(i)] == spec.shape[size_t(i)];
      KILN_CHECK(same && t.is_contiguous(), "'", spec.name, "' has shape ", t.describe(),
                 "; the config implies ", shape_text(spec.shape));
      copy_bytes(buf.data(), device_, t.data, Device::cpu(), size_t(n) * sizeof(bf16_t));
    } else {
      std::vector<bf16_t> host(static_cast<size_t>(n));
      fill_random_weight(spec, seed_, host.data());
      copy_bytes(buf.data(), device_, host.data(), Device::cpu(), size_t(n) * sizeof(bf16_t));
    }
    Tensor t = buf.view(DType::bf16, view);
    KILN_CHECK_EQ(t.numel(), n, "vision weight view of ", spec.name);
    w_.storage.push_back(std::move(buf));
    return t;
  }

 private:
  static std::string shape_text(const std::vector<int64_t>& s) {
    std::string o = "[";
    for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
    return o + "]";
  }
  const Checkpoint* ckpt_;
  uint64_t seed_;
  Device device_;
  VisionWeights& w_;
};

void push_linear(std::vector<WeightSpec>& s, const std::string& name, int64_t out, int64_t in) {
  s.push_back({name + ".weight", {out, in}, false});
  s.push_back({name + ".bias", {out}, false});
}
void push_norm(std::vector<WeightSpec>& s, const std::string& name, int64_t n) {
  s.push_back({name + ".weight", {n}, true});
  s.push_back({name + ".bias", {n}, false});
}

// A bf16 activation matrix on the tower's device.
struct Mat {
  Buffer buf;
  int64_t rows = 0, cols = 0;
  Mat(int64_t r, int64_t c, Device d)
      : buf(size_t(std::max<int64_t>(r * c, 1)) * sizeof(bf16_t), d), rows(r), cols(c) {}
  Tensor t() const { return as(rows, cols); }
  Tensor as(int64_t r, int64_t c) const {
    Tensor v(buf.data(), DType::bf16, {r, c}, buf.device());
    return v;
  }
};

void linear(const Tensor& x, const VisionLinear& l, const Tensor& out) {
  ops::linear_bias(x, l.w, l.b, out);
}

// out = fc2(GELU(fc1(x))) with exact GELU: the merger MLPs; h: the fc1 activation scratch.
void merger_mlp(const Tensor& x, const VisionMergerWeights& m, const Tensor& h, const Tensor& out) {
  linear(x, m.fc1, h);
  ops::gelu(h, h, ops::GeluApprox::none);
  linear(h, m.fc2, out);
}

// A host vector copied into a new Buffer on `d` (at least 1 byte).
template <typename T>
Buffer upload_vector(const std::vector<T>& v, Device d) {
  Buffer b(std::max<size_t>(v.size() * sizeof(T), 1), d);
  copy_bytes(b.data(), d, v.data(), Device::cpu(), v.size() * sizeof(T));
  return b;
}

// Device rows -> host bf16 rows [r0, r0 + n) of a [*, cols] matrix.
std::vector<bf16_t> host_rows(const Mat& m, int64_t r0, int64_t n) {
  std::vector<bf16_t> v(static_cast<size_t>(n * m.cols));
  copy_bytes(v.data(), Device::cpu(), static_cast<const bf16_t*>(m.buf.data()) + r0 * m.cols, m.buf.device(),
             v.size() * sizeof(bf16_t));
  return v;
}

}  // namespace

std::vector<WeightSpec> qwen3_vl_vision_weight_specs(const ModelConfig& c) {
  KILN_CHECK(c.has_vision, "qwen3_vl_vision_weight_specs: the config has no vision tower");
  const VisionConfig& v = c.vision;
  const std::string p = kPrefix;
  const int64_t h = v.hidden_size, m4 = v.merged_dim();
  std::vector<WeightSpec> s;
  s.push_back({p + "patch_embed.proj.weight",
               {h, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size},
               false});
  s.push_back({p + "patch_embed.proj.bias", {h}, false});
  s.push_back({p + "pos_embed.weight", {v.num_position_embeddings, h}, false});
  for (int64_t i = 0; i < v.depth; ++i) {
    const std::string b = p + "blocks." + std::to_string(i) + ".";
    push_norm(s, b + "norm1", h);
    push_norm(s, b + "norm2", h);
    push_linear(s, b + "attn.qkv", 3 * h, h);
    push_linear(s, b + "attn.proj", h, h);
    push_linear(s, b + "mlp.linear_fc1", v.intermediate_size, h);
    push_linear(s, b + "mlp.linear_fc2", h, v.intermediate_size);
  }
  push_norm(s, p + "merger.norm", h);
  push_linear(s, p + "merger.linear_fc1", m4, m4);
  push_linear(s, p + "merger.linear_fc2", v.out_hidden_size, m4);
  for (size_t j = 0; j < v.deepstack_visual_indexes.size(); ++j) {
    const std::string d = p + "deepstack_merger_list." + std::to_string(j) + ".";
    push_norm(s, d + "norm", m4);
    push_linear(s, d + "linear_fc1", m4, m4);
    push_linear(s, d + "linear_fc2", v.out_hidden_size, m4);
  }
  return s;
}

Qwen3VLVision::Qwen3VLVision(const ModelConfig& c, const Checkpoint* ckpt, uint64_t seed, Device device)
    : cfg_(c.vision), device_(device) {
  const std::vector<WeightSpec> specs = qwen3_vl_vision_weight_specs(c);
  Loader ld(ckpt, seed, device, w_);
  size_t i = 0;
  auto next = [&](std::initializer_list<int64_t> view) { return ld.load(specs[i++], view); };
  auto lin = [&](int64_t out, int64_t in) {
    VisionLinear l;
    l.w = next({out, in});
    l.b = next({out});
    return l;
  };
  auto norm = [&](int64_t n) {
    VisionNorm l;
    l.w = next({n});
    l.b = next({n});
    return l;
  };
  const int64_t h = cfg_.hidden_size, m4 = cfg_.merged_dim(), I = cfg_.intermediate_size;
  w_.patch_embed.w = next({h, cfg_.patch_dim()});
  w_.patch_embed.b = next({h});
  w_.pos_embed = next({cfg_.num_position_embeddings, h});
  for (int64_t b = 0; b < cfg_.depth; ++b) {
    VisionBlockWeights bw;
    bw.norm1 = norm(h);
    bw.norm2 = norm(h);
    bw.qkv = lin(3 * h, h);
    bw.proj = lin(h, h);
    bw.fc1 = lin(I, h);
    bw.fc2 = lin(h, I);
    w_.blocks.push_back(bw);
  }
  w_.merger.norm = norm(h);
  w_.merger.fc1 = lin(m4, m4);
  w_.merger.fc2 = lin(cfg_.out_hidden_size, m4);
  for (size_t j = 0; j < cfg_.deepstack_visual_indexes.size(); ++j) {
    VisionMergerWeights mw;
    mw.norm = norm(m4);
    mw.fc1 = lin(m4, m4);
    mw.fc2 = lin(cfg_.out_hidden_size, m4);
    w_.deepstack.push_back(mw);
  }
  KILN_CHECK_EQ(i, specs.size(), "vision weights loaded vs specs");
}

void Qwen3VLVision::check_image(const vision::ImagePatches& img) const {
  check_vl_image(cfg_, img, 0);
}

std::vector<bf16_t> Qwen3VLVision::position_embedding(const vision::ImagePatches& img) const {
  const int64_t h = cfg_.hidden_size, n = img.patches();
  const Buffer lin =
      upload_vector(ops::pos_embed_linspace(cfg_.grid_side(), img.grid_h, img.grid_w), device_);
  const Mat out(n, h, device_);
  ops::pos_embed_interpolate(w_.pos_embed, lin.view(DType::f32, {img.grid_h + img.grid_w}), img.grid_t,
                             img.grid_h, img.grid_w, cfg_.spatial_merge_size, out.t());
  return host_rows(out, 0, n);
}

std::vector<VisionOutput> Qwen3VLVision::encode(const std::vector<const vision::ImagePatches*>& images,
                                                const std::function<bool()>& stop) const {
  const int64_t h = cfg_.hidden_size, m = cfg_.spatial_merge_size, nh = cfg_.num_heads, D = cfg_.head_dim();
  const int64_t unit = m * m, pd = cfg_.patch_dim();
  int64_t N = 0, max_hw = 1;
  for (const vision::ImagePatches* img : images) {
    KILN_CHECK(img != nullptr, "encode: null image");
    check_image(*img);
    N += img->patches();
    max_hw = std::max<int64_t>({max_hw, img->grid_h, img->grid_w});
  }
  std::vector<VisionOutput> outs(images.size());
  if (N == 0) return outs;

  // The per-patch (row, column), the attention segments (one per frame of each image: transformers'
  // cu_seqlens repeats h * w per frame) and the position-embedding linspaces of every image, on the host
  // (O(patches + grid sides)); the O(patches * hidden) work runs on the tower's device below.
  const Device dev = device_;
  std::vector<int32_t> pos(static_cast<size_t>(2 * N)), cu{0};
  std::vector<float> lin;
  int64_t r0 = 0;
  for (const vision::ImagePatches* img : images) {
    const int64_t n = img->patches();
    const std::vector<float> l = ops::pos_embed_linspace(cfg_.grid_side(), img->grid_h, img->grid_w);
    lin.insert(lin.end(), l.begin(), l.end());
    int64_t r = r0;
    for (int64_t t = 0; t < img->grid_t; ++t) {
      for (int64_t bh = 0; bh < img->grid_h / m; ++bh)
        for (int64_t bw = 0; bw < img->grid_w / m; ++bw)
          for (int64_t ir = 0; ir < m; ++ir)
            for (int64_t ic = 0; ic < m; ++ic, ++r) {
              pos[size_t(2 * r)] = int32_t(bh * m + ir);
              pos[size_t(2 * r + 1)] = int32_t(bw * m + ic);
            }
      cu.push_back(int32_t(cu.back() + img->grid_h * img->grid_w));
    }
    r0 += n;
  }
  const Buffer pos_b = upload_vector(pos, dev), cu_b = upload_vector(cu, dev),
               lin_b = upload_vector(lin, dev);
  const Buffer table = ops::build_rope_2d_table(int(D), kRopeTheta, max_hw, dev);
  const ops::RopeTable2d rope = ops::rope_2d_table_view(table, int(D), max_hw);
  const Tensor pos_t = pos_b.view(DType::i32, {N, 2});
  const Tensor cu_t = cu_b.view(DType::i32, {int64_t(cu.size())});

  const int64_t I = cfg_.intermediate_size, m4 = h * unit, out_h = cfg_.out_hidden_size;
  Mat x(N, h, dev), normed(N, h, dev), attn(N, h, dev), tmp(N, h, dev), qkv(N, 3 * h, dev), f(N, I, dev);
  Mat n4(N / unit, m4, dev), f4(N / unit, m4, dev);
  // Pixel rows rounded to bf16 (HF: pixel_values.type(visual.dtype)) and the interpolated position embedding,
  // both on the tower's device; on CUDA the f32 pixel rows go up as they are (on the CPU backend the cast
  // reads the images' own rows). These buffers live to the end of encode, past every kernel reading them.
  Mat px(N, pd, dev), pe(N, h, dev);
  const Buffer px_f32(dev.is_cuda() ? size_t(N * pd) * sizeof(float) : 0, dev);
  for (int64_t i = 0, r = 0, l = 0; i < int64_t(images.size()); ++i) {
    const vision::ImagePatches& img = *images[size_t(i)];
    const int64_t n = img.patches(), nl = img.grid_h + img.grid_w;
    Tensor src(const_cast<float*>(img.values.data()), DType::f32, {n, pd});
    if (dev.is_cuda()) {
      float* d = static_cast<float*>(px_f32.data()) + r * pd;
      copy_bytes(d, dev, img.values.data(), Device::cpu(), size_t(n * pd) * sizeof(float));
      src = Tensor(d, DType::f32, {n, pd}, dev);
    }
    const auto rows = [&](const Mat& mat) {
      return Tensor(static_cast<bf16_t*>(mat.buf.data()) + r * mat.cols, DType::bf16, {n, mat.cols}, dev);
    };
    ops::cast_to_bf16(src, rows(px));
    ops::pos_embed_interpolate(w_.pos_embed,
                               Tensor(static_cast<float*>(lin_b.data()) + l, DType::f32, {nl}, dev),
                               img.grid_t, img.grid_h, img.grid_w, m, rows(pe));
    r += n, l += nl;
  }
  linear(px.t(), w_.patch_embed, x.t());
  ops::add(x.t(), pe.t(), x.t());

  const ops::GeluApprox act = cfg_.hidden_act == "gelu" ? ops::GeluApprox::none : ops::GeluApprox::tanh;
  std::vector<Mat> deep;
  const float scale = float(1.0 / std::sqrt(double(D)));
  auto* qkv_base = static_cast<bf16_t*>(qkv.buf.data());
  const auto part = [&](int64_t k) {
    return Tensor::strided(qkv_base + k * h, DType::bf16, {N, nh, D}, {3 * h, D, 1}, dev);
  };
  const auto check_stop = [&] {
    if (stop && stop()) throw VisionCancelled();
  };
  for (int64_t b = 0; b < cfg_.depth; ++b) {
    check_stop();
    const VisionBlockWeights& bw = w_.blocks[size_t(b)];
    ops::layer_norm(x.t(), bw.norm1.w, bw.norm1.b, kNormEps, normed.t());
    linear(normed.t(), bw.qkv, qkv.t());
    ops::rope_2d(qkv.t(), pos_t, rope, int(nh));
    // The block's long op on the CPU (quadratic in an image's patches): it polls `stop` itself.
    ops::varlen_attention(part(0), part(1), part(2), cu_t,
                          Tensor(attn.buf.data(), DType::bf16, {N, nh, D}, dev), scale, stop);
    check_stop();
    linear(attn.t(), bw.proj, tmp.t());
    ops::add(x.t(), tmp.t(), x.t());
    ops::layer_norm(x.t(), bw.norm2.w, bw.norm2.b, kNormEps, normed.t());
    linear(normed.t(), bw.fc1, f.t());
    ops::gelu(f.t(), f.t(), act);
    linear(f.t(), bw.fc2, tmp.t());
    ops::add(x.t(), tmp.t(), x.t());
    const auto& di = cfg_.deepstack_visual_indexes;
    if (const auto it = std::find(di.begin(), di.end(), b); it != di.end()) {
      // [N, h] rows of each 2x2 block are adjacent: the same bytes as [N / 4, 4h] (the post-shuffle norm).
      const VisionMergerWeights& dm = w_.deepstack[size_t(it - di.begin())];
      ops::layer_norm(x.as(N / unit, m4), dm.norm.w, dm.norm.b, kNormEps, n4.t());
      deep.emplace_back(N / unit, out_h, dev);
      merger_mlp(n4.t(), dm, f4.t(), deep.back().t());
    }
  }
  check_stop();
  ops::layer_norm(x.t(), w_.merger.norm.w, w_.merger.norm.b, kNormEps, normed.t());
  Mat merged(N / unit, out_h, dev);
  merger_mlp(normed.as(N / unit, m4), w_.merger, f4.t(), merged.t());

  int64_t row = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    VisionOutput& o = outs[i];
    o.tokens = images[i]->merged_tokens(int(m));
    o.embeds = host_rows(merged, row, o.tokens);
    for (const Mat& d : deep) o.deepstack.push_back(host_rows(d, row, o.tokens));
    row += o.tokens;
  }
  return outs;
}

}  // namespace kiln
