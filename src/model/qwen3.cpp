#include "model/qwen3.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/error.h"
#include "kiln/safetensors.h"
#include "kiln/staged_upload.h"
#include "model/cuda_tune.h"
#include "model/slot_buffers.h"
#include "ops/attention.h"
#include "ops/attn_prep.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/rms_norm.h"
#include "ops/rope_table.h"
#include "ops/rows.h"
#include "ops/stream.h"

namespace kiln {
namespace {

// The most rows a sequence of a step may have for its attention to run as decode rows (k + 1 of a verify
// step, k <= 7; a larger k, or a prefill chunk longer than 8, runs the prefill kernel). Past 8 rows the
// decode kernel's per-row re-reads of the context cost more than the prefill kernel's one pass.
constexpr int32_t kVerifyRowsPerSeq = 8;

// The sparse MLP's device scratch for a step of `tokens` rows (every sparse layer has one shape); 0 without
// sparse layers or on the CPU.
int64_t moe_scratch_bytes(const Qwen3Weights& w, const ModelConfig& c, int64_t tokens, Device device) {
  for (const LayerWeights& lw : w.layers)
    if (lw.moe.present()) return ops::moe_scratch_bytes(lw.moe, c.hidden_size, tokens, device);
  return 0;
}

}  // namespace

// Per-step activations and uploaded batch metadata on the model's device; buffers grow (doubling) to
// the largest step seen, so steady-state steps allocate nothing.
struct Qwen3Model::Workspace : SlotBuffers {
  enum Slot {
    ids,
    positions,
    slots,
    cu_q,
    kv_lens,
    page_table,
    rows,
    residual,
    normed,
    qkv,
    attn,
    tmp,
    gate_up,
    act,
    vis_rows,
    vis_embeds,
    vis_deep,
    tp_partial,   // tensor parallelism: f32 [T, hidden] row-parallel partials (f32 reduce)
    tp_logits,    // tensor parallelism: f32 [tp, R, ceil(vocab / tp)] the LM head's all-gather
    moe,          // the sparse MLP's device scratch (ops::moe_scratch_bytes); empty on the CPU
    aux,          // EAGLE-3 features: bf16 [T, 3 hidden] (set_aux_capture)
    iota,         // i32 0, 1, 2, ...: the rows the feature copies gather
    tree_window,  // i32 [B]: a token-tree step's windows
    tree_mask,    // i64 [T]: its rows' masks
    num_slots
  };
  explicit Workspace(Device d) : SlotBuffers(d, num_slots) {}

  // An activation buffer (residual .. act) for T token rows: its one size formula, for stage and
  // reserve_workspace alike.
  void* activation(Slot s, const ModelConfig& c, int64_t T) {
    const size_t H = size_t(c.hidden_size), I = size_t(c.intermediate_size), D = size_t(c.head_dim);
    size_t cols = 0;
    switch (s) {
      case residual:
      case normed:
      case tmp:
        cols = H;
        break;
      case qkv:
        cols = size_t(c.num_heads + 2 * c.num_kv_heads) * D;
        break;
      case attn:
        cols = size_t(c.num_heads) * D;
        break;
      case gate_up:
        cols = 2 * I;
        break;
      case act:
        cols = I;
        break;
      default:
        KILN_FAIL("Workspace::activation: slot ", int(s), " is not an activation");
    }
    return get(s, size_t(T) * cols * sizeof(bf16_t));
  }
  template <typename T>
  void* upload(Slot s, const std::vector<T>& v) {
    void* p = get(s, v.size() * sizeof(T));
    copy_bytes(p, device, v.data(), Device::cpu(), v.size() * sizeof(T));
    return p;
  }

  int64_t T = 0;        // tokens of the last run_layers
  Tensor final_hidden;  // bf16 [T, hidden]: final-norm output of the last run_layers
  Tensor rows_t;        // i32 [R]: the last batch's logit rows
  // Views made by stage() for launch_layers().
  Tensor ids_v, residual_v, normed_v, qkv_v, attn_v, tmp_v, gate_up_v, act_v, tp_partial_v, tp_logits_v;
  Tensor moe_v;          // u8 [bytes]: moe_mlp's scratch for T tokens
  Tensor aux_v, iota_v;  // bf16 [T, 3 hidden], i32 [T] (aux capture on)
  int64_t iota_len = 0;  // the iota values uploaded
  // The aux and iota buffers for T rows; uploads 0, 1, ... once the iota buffer outgrows what was uploaded.
  void reserve_aux(int64_t T, int64_t H) {
    get(aux, size_t(T) * size_t(3 * H) * sizeof(bf16_t));
    void* p = get(iota, size_t(T) * 4);
    const int64_t cap = int64_t(bufs[size_t(iota)].bytes() / 4);
    if (iota_len == cap) return;
    std::vector<int32_t> v(static_cast<size_t>(cap));
    for (int64_t i = 0; i < cap; ++i) v[size_t(i)] = int32_t(i);
    copy_bytes(p, device, v.data(), Device::cpu(), v.size() * 4);
    iota_len = cap;
  }
  ops::AttnPrepArgs prep;
  ops::PagedAttentionArgs att;
  // The step's image-token rows (stage_visual): rows i32 [n], embeds bf16 [n, H], deep bf16 [L, n, H].
  int64_t vis_n = 0, vis_layers = 0;
  Tensor vis_rows_v, vis_embeds_v;
  std::vector<Tensor> vis_deep_v;
};

Qwen3Model::Qwen3Model(const ModelConfig& cfg, Qwen3Weights weights, std::unique_ptr<Qwen3VLVision> vision,
                       const LoadOptions& opts)
    : cfg_(cfg),
      opts_(opts),
      weights_(std::move(weights)),
      ws_(std::make_unique<Workspace>(opts.device)),
      vision_(std::move(vision)) {
  max_position_ = opts.max_position > 0 ? opts.max_position : cfg_.max_context();
  KILN_CHECK(max_position_ > 0, "max_position_embeddings must be positive");
  // Dynamic NTK changes the frequencies only past max_position_embeddings; the table stops there.
  KILN_CHECK(
      cfg_.rope_scaling.kind != RopeScalingKind::dynamic || max_position_ <= cfg_.max_position_embeddings,
      "rope_type 'dynamic' recomputes its frequencies past max_position_embeddings (",
      cfg_.max_position_embeddings, "); kiln's rotary table is static, so the context is limited to it, not ",
      max_position_);
  rope_buf_ = ops::build_rope_table(int(cfg_.rotary_dim()), cfg_.rope_theta, cfg_.rope_scaling, max_position_,
                                    opts.device);
}

Qwen3Model::~Qwen3Model() = default;

std::unique_ptr<Qwen3Model> Qwen3Model::create(const ModelConfig& cfg_in, const Checkpoint* ckpt,
                                               const LoadOptions& opts) {
  ModelConfig cfg = cfg_in;
  KILN_CHECK(opts.quantization.empty() || opts.quantization == "none" || opts.quantization == "fp8",
             "--quantization must be none or fp8, got '", opts.quantization, "'");
  if (opts.quantization == "fp8" && cfg.quant.method.empty()) cfg.quant.online = true;
  KILN_CHECK(cfg.arch == ModelArch::qwen3 || cfg.arch == ModelArch::qwen3_vl_text ||
                 cfg.arch == ModelArch::qwen3_embedding || cfg.arch == ModelArch::qwen3_moe,
             "unsupported architecture '", cfg.architecture, "'");
  KILN_CHECK(cfg.dtype == DType::bf16, "kiln runs bf16 checkpoints; config.json says ",
             dtype_name(cfg.dtype));
  if (opts.tp) {  // this rank's slice, with the rank's shapes (model/tensor_parallel.h)
    KILN_CHECK(!cfg.has_vision,
               "tensor parallelism (--tp) does not shard the Qwen3-VL vision tower: serve a "
               "checkpoint with images at --tp 1");
    const ModelConfig local = shard_config(cfg, opts.tp->plan);
    Qwen3Weights w = load_qwen3_weights_shard(cfg, opts.tp->plan, ckpt, opts.seed, opts.device);
    if (opts.device.is_cuda()) {
      ModelConfig tuned = local;  // the LM head GEMM is [R, the rank's vocab rows]
      tuned.vocab_size = opts.tp->plan.vocab.size();
      cuda_autotune_if_needed(tuned, opts.tp->plan.experts.size());  // MoE: the experts this rank holds
    }
    auto m = std::unique_ptr<Qwen3Model>(new Qwen3Model(local, std::move(w), nullptr, opts));
    m->tp_ = *opts.tp;
    m->opts_.tp = nullptr;
    return m;
  }
  Qwen3Weights w = load_qwen3_weights(cfg, ckpt, opts.seed, opts.device);
  std::unique_ptr<Qwen3VLVision> vision;
  if (cfg.has_vision) vision = std::make_unique<Qwen3VLVision>(cfg, ckpt, opts.seed, opts.device);
  if (opts.device.is_cuda()) cuda_autotune_if_needed(cfg);
  return std::unique_ptr<Qwen3Model>(new Qwen3Model(cfg, std::move(w), std::move(vision), opts));
}

std::unique_ptr<Qwen3Model> Qwen3Model::load(const std::string& dir, const LoadOptions& opts) {
  ModelConfig cfg = load_model_config(dir);
  if (opts.is_embedding) force_embedding(cfg);
  if (opts.load_format == LoadFormat::random) return create(cfg, nullptr, opts);
  const Checkpoint ckpt = Checkpoint::open(dir);
  // Qwen3-Embedding ships unprefixed names ("layers.0...") that config.json cannot reveal.
  adapt_weight_prefix(cfg, ckpt.names());
  return create(cfg, &ckpt, opts);
}

void Qwen3Model::run_layers(const BatchDesc& b, KvCache& cache, const VisualInput* visual) {
  stage(b, cache);
  stage_visual(visual);
  launch_layers(cache);
}

void Qwen3Model::stage_visual(const VisualInput* v) {
  Workspace& w = *ws_;
  w.vis_n = 0;
  w.vis_layers = 0;
  w.vis_deep_v.clear();
  if (!v || v->empty()) return;
  KILN_CHECK(cfg_.has_vision, "image rows given to a model without a vision tower");
  const int64_t n = int64_t(v->rows.size()), H = cfg_.hidden_size, L = v->deepstack_layers;
  KILN_CHECK(L >= 0 && L <= cfg_.num_layers, "deepstack layers ", L, " outside [0, ", cfg_.num_layers, "]");
  KILN_CHECK(int64_t(v->embeds.size()) == n * H && int64_t(v->deepstack.size()) == L * n * H,
             "visual input: embeds / deepstack sizes do not match ", n, " rows of ", H);
  for (int64_t i = 0; i < n; ++i)
    KILN_CHECK(v->rows[size_t(i)] >= 0 && v->rows[size_t(i)] < w.T &&
                   (i == 0 || v->rows[size_t(i)] > v->rows[size_t(i - 1)]),
               "visual input: rows must ascend within [0, ", w.T, ")");
  const Device dev = device();
  w.vis_rows_v = Tensor(w.upload(Workspace::vis_rows, v->rows), DType::i32, {n}, dev);
  w.vis_embeds_v = Tensor(w.upload(Workspace::vis_embeds, v->embeds), DType::bf16, {n, H}, dev);
  if (L > 0) {
    auto* base = static_cast<bf16_t*>(w.upload(Workspace::vis_deep, v->deepstack));
    for (int64_t l = 0; l < L; ++l)
      w.vis_deep_v.push_back(Tensor(base + l * n * H, DType::bf16, {n, H}, dev));
  }
  w.vis_n = n;
  w.vis_layers = L;
}

void* Qwen3Model::staged_token_ids() const {
  return ws_->ids_v.data;
}

void Qwen3Model::drop_per_step_attention_bounds() {
  ws_->att.prefill_pages = 0;  // 0: unknown, no staging (ops/attention.h)
}

void Qwen3Model::stage(const BatchDesc& b, KvCache& cache) {
  const ModelConfig& c = cfg_;
  // validate() checks a tree's windows and masks too: on CUDA it is their only check (ops/attention.h).
  b.validate(c.vocab_size, cache.num_pages());
  KILN_CHECK_EQ(b.page_size, cache.page_size(), "batch page_size vs KV cache page size");
  KILN_CHECK_EQ(int64_t(cache.num_layers()), c.num_layers, "KV cache layers vs model layers");
  KILN_CHECK(cache.device() == device(), "KV cache on ", device_name(cache.device()), ", model on ",
             device_name(device()));
  {
    const ops::KvCacheView v = cache.layer(0);
    const int64_t hkv = v.k.shape[v.layout == ops::KvLayout::nhd ? 2 : 1];
    KILN_CHECK(hkv == c.num_kv_heads && v.k.shape[3] == c.head_dim, "KV cache shape ", v.k.describe(),
               " does not fit the model's ", c.num_kv_heads, " KV heads of dim ", c.head_dim);
  }
  KILN_CHECK(!b.mrope || c.mrope_section.size() == 3,
             "M-RoPE positions given to a model without mrope_section");
  for (int32_t p : b.positions) {
    KILN_CHECK(p >= 0 && p < max_position_, "position ", p, " outside [0, ", max_position_, ")");
  }

  Workspace& w = *ws_;
  w.vis_n = 0;  // a step has no image rows unless stage_visual gives them
  w.vis_layers = 0;
  const Device dev = device();
  const int64_t T = b.num_tokens(), B = b.num_seqs(), R = int64_t(b.logit_rows.size());
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t Hq = c.num_heads, Hkv = c.num_kv_heads, qkv_dim = (Hq + 2 * Hkv) * D;
  w.T = T;

  // The inputs leave by asynchronous copies on the stream the step launches on, not by one synchronous
  // pageable cudaMemcpy each (staging + launch of a batch-1 serving step 68 -> 55 µs; H200, 2026-12-03,
  // `0546dfd`: bench/results/h200_prefill_wait_staged_inputs_2026-12-03.txt).
  {
    const auto fp = [](const auto& v) { return StagedUploads::footprint(v.size() * sizeof(v[0])); };
    w.staged.begin(fp(b.tokens) + fp(b.positions) + fp(b.slot_mapping) + fp(b.cu_q) + fp(b.kv_lens) +
                       fp(b.page_table) + fp(b.logit_rows) + fp(b.tree_window) + fp(b.tree_mask),
                   ops::current_stream());
  }
  Tensor ids(w.stage_input(Workspace::ids, b.tokens), DType::i32, {T}, dev);
  void* const pos_p = w.stage_input(Workspace::positions, b.positions);
  Tensor pos = b.mrope ? Tensor(pos_p, DType::i32, {3, T}, dev) : Tensor(pos_p, DType::i32, {T}, dev);
  Tensor slots(w.stage_input(Workspace::slots, b.slot_mapping), DType::i64, {T}, dev);
  Tensor cu(w.stage_input(Workspace::cu_q, b.cu_q), DType::i32, {B + 1}, dev);
  Tensor kv_lens(w.stage_input(Workspace::kv_lens, b.kv_lens), DType::i32, {B}, dev);
  Tensor pt(w.stage_input(Workspace::page_table, b.page_table), DType::i32, {B, b.pages_stride}, dev);
  w.rows_t = Tensor(w.stage_input(Workspace::rows, b.logit_rows), DType::i32, {R}, dev);
  Tensor tree_window, tree_mask;  // none unless the batch is a token tree
  if (b.has_tree()) {
    tree_window = Tensor(w.stage_input(Workspace::tree_window, b.tree_window), DType::i32, {B}, dev);
    tree_mask = Tensor(w.stage_input(Workspace::tree_mask, b.tree_mask), DType::i64, {T}, dev);
  }
  w.staged.end();

  Tensor residual(w.activation(Workspace::residual, c, T), DType::bf16, {T, H}, dev);
  Tensor normed(w.activation(Workspace::normed, c, T), DType::bf16, {T, H}, dev);
  Tensor qkv(w.activation(Workspace::qkv, c, T), DType::bf16, {T, qkv_dim}, dev);
  Tensor attn(w.activation(Workspace::attn, c, T), DType::bf16, {T, Hq, D}, dev);
  Tensor tmp(w.activation(Workspace::tmp, c, T), DType::bf16, {T, H}, dev);
  Tensor gate_up(w.activation(Workspace::gate_up, c, T), DType::bf16, {T, 2 * I}, dev);
  Tensor act(w.activation(Workspace::act, c, T), DType::bf16, {T, I}, dev);
  w.final_hidden = normed;
  w.ids_v = ids, w.residual_v = residual, w.normed_v = normed, w.qkv_v = qkv, w.attn_v = attn, w.tmp_v = tmp;
  w.gate_up_v = gate_up, w.act_v = act;
  if (const int64_t moe_bytes = moe_scratch_bytes(weights_, c, T, dev); moe_bytes > 0)
    w.moe_v = Tensor(w.get(Workspace::moe, size_t(moe_bytes)), DType::u8, {moe_bytes}, dev);
  if (!aux_layers_.empty()) {
    w.reserve_aux(T, H);
    w.aux_v = Tensor(w.bufs[Workspace::aux].data(), DType::bf16, {T, 3 * H}, dev);
    w.iota_v = Tensor(w.bufs[Workspace::iota].data(), DType::i32, {T}, dev);
  }
  if (tp_) {
    if (tp_->reduce == dist::ReduceType::f32)
      w.tp_partial_v = Tensor(w.get(Workspace::tp_partial, size_t(T * H) * 4), DType::f32, {T, H}, dev);
    const int64_t n = tp_gathered_elems(*tp_, R);
    w.tp_logits_v = Tensor(w.get(Workspace::tp_logits, size_t(n) * 4), DType::f32, {n}, dev);
  }

  // Q stays in place in the QKV rows: [T, Hq, D] with the QKV row stride.
  const Tensor q = Tensor::strided(qkv.data, DType::bf16, {T, Hq, D}, {qkv_dim, D, 1}, dev);
  const float eps = float(c.rms_norm_eps);
  ops::AttnPrepArgs prep;
  prep.qkv = qkv;
  prep.eps = eps;
  prep.positions = pos;
  prep.rope = ops::rope_table_view(rope_buf_, int(c.rotary_dim()), max_position_);
  if (b.mrope) {
    prep.mrope.enabled = true;
    prep.mrope.interleaved = c.mrope_interleaved;
    for (int i = 0; i < 3; ++i) prep.mrope.section[size_t(i)] = c.mrope_section[size_t(i)];
  }
  prep.slot_mapping = slots;
  prep.num_q_heads = int(Hq);
  prep.num_kv_heads = int(Hkv);
  prep.head_dim = int(D);
  ops::PagedAttentionArgs att;
  att.q = q;
  att.cu_q = cu;
  att.kv_lens = kv_lens;
  att.page_table = pt;
  att.out = attn;
  att.scale = float(1.0 / std::sqrt(double(D)));
  att.tree_window = tree_window;
  att.tree_mask = tree_mask;
  att.min_q_len = B > 0 ? std::numeric_limits<int32_t>::max() : 0;
  int32_t max_q_len = 0;
  for (int64_t s = 0; s < B; ++s) {
    if (b.q_len(int(s)) >= 2) att.prefill_pages += (b.kv_lens[size_t(s)] + b.page_size - 1) / b.page_size;
    att.min_q_len = std::min(att.min_q_len, b.q_len(int(s)));
    max_q_len = std::max(max_q_len, b.q_len(int(s)));
  }
  // A step of at most kVerifyRowsPerSeq rows a sequence (a verify step: the last token and its drafts) may
  // run every row through the decode kernel as a plain decode step of its length would (ops/attention.h; the
  // CUDA launcher does up to 4 rows by default), and its projections with the plain step's tactics
  // (LinearTacticRows, where switched on): its logits are then the plain step's, bit for bit.
  if (max_q_len >= 2 && max_q_len <= kVerifyRowsPerSeq) att.decode_rows_per_seq = max_q_len;
  w.prep = prep;
  w.att = att;
}

// The launches of one step on the views stage() made: no host synchronisation and no allocation, so a
// CUDA graph can capture them (model/cuda_graph.cpp).
void Qwen3Model::launch_layers(KvCache& cache) {
  const ModelConfig& c = cfg_;
  Workspace& w = *ws_;
  const int64_t T = w.T;
  if (T == 0) return;
  const ops::LinearTacticRows tactics(device(), verify_tactic_rows());
  const int64_t Hq = c.num_heads, D = c.head_dim;
  const float eps = float(c.rms_norm_eps);
  Tensor &ids = w.ids_v, &residual = w.residual_v, &normed = w.normed_v, &attn = w.attn_v;
  Tensor &tmp = w.tmp_v, &gate_up = w.gate_up_v, &act = w.act_v;
  ops::AttnPrepArgs& prep = w.prep;
  ops::PagedAttentionArgs& att = w.att;
  prep.stream = ops::current_stream();

  // O and down with the add + norm: under tensor parallelism the rank's partial products are all-reduced
  // before it.
  const auto project = [&](const Tensor& x, const ops::LinearWeight& weight, const Tensor& norm) {
    if (tp_) return tp_linear_add_rms_norm(*tp_, x, weight, residual, norm, eps, tmp, w.tp_partial_v, normed);
    ops::linear_add_rms_norm(x, weight, residual, norm, eps, tmp, normed);
  };
  ops::embedding(weights_.embed, ids, residual);
  if (w.vis_n > 0) ops::scatter_rows(residual, w.vis_rows_v, w.vis_embeds_v, /*accumulate=*/false);
  ops::rms_norm(residual, weights_.layers[0].input_norm, eps, normed);
  // Without tensor parallelism the residual add and RMSNorm after O and after down (but the last, which
  // feeds the LM head, and the deepstack layers', which add image features first) belong to the next
  // projection: ops::ResidualNorm, which may run them in its GEMV's prologue. `pending`: the next QKV's input
  // is rms_norm(residual + tmp) rather than normed.
  bool pending = false;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = weights_.layers[size_t(l)];
    prep.q_norm = lw.q_norm;
    prep.k_norm = lw.k_norm;
    prep.cache = cache.layer(int(l));
    // At decode sizes one kernel where switched on (the QKV GEMV with the preparation as its epilogue), else
    // the GEMV or GEMM, then attn_prep.
    if (pending) {
      ops::linear_attn_prep(ops::ResidualNorm{tmp, residual, lw.input_norm, eps, normed}, lw.qkv, prep);
    } else {
      ops::linear_attn_prep(normed, lw.qkv, prep);
    }
    // EAGLE-3's features: the residual holds the stream entering layer l now (the pending add is done).
    for (size_t i = 0; i < aux_layers_.size(); ++i) {
      if (aux_layers_[i] != l) continue;
      const int64_t H = c.hidden_size;
      ops::embedding(residual, w.iota_v,
                     Tensor::strided(static_cast<bf16_t*>(w.aux_v.data) + int64_t(i) * H, DType::bf16, {T, H},
                                     {3 * H, 1}, w.aux_v.device));
    }
    att.cache = prep.cache;
    ops::paged_attention(att);
    const Tensor o_in = attn.reshape({T, Hq * D});
    if (lw.moe.present()) {  // the sparse MLP (ops/moe.h) into tmp; MoE models have no images (create)
      const bool last = l + 1 == c.num_layers;
      if (tp_) {  // the rank's partials all-reduced, then the next norm (dist/shard_plan.h)
        project(o_in, lw.o_proj, lw.post_norm);
        const Tensor& next_norm = last ? weights_.final_norm : weights_.layers[size_t(l + 1)].input_norm;
        tp_moe_add_rms_norm(*tp_, normed, lw.moe, residual, next_norm, eps, tmp, w.tp_partial_v, normed,
                            w.moe_v);
        pending = false;
        continue;
      }
      ops::linear(o_in, lw.o_proj, tmp);  // then the add and the norm in the router's launch (ops/moe.h)
      ops::moe_mlp(ops::ResidualNorm{tmp, residual, lw.post_norm, eps, normed}, lw.moe, tmp, w.moe_v);
      pending = !last;  // the next QKV adds tmp and norms; after the last layer, the final norm here
      if (last) ops::add_rms_norm(tmp, residual, weights_.final_norm, eps, normed);
      continue;
    }
    // After down, the next layer's input norm, or the final norm after the last layer.
    const bool last = l + 1 == c.num_layers;
    const Tensor& next_norm = last ? weights_.final_norm : weights_.layers[size_t(l + 1)].input_norm;
    pending = !tp_ && !last && l >= w.vis_layers;
    if (tp_) {
      project(o_in, lw.o_proj, lw.post_norm);
      ops::linear_silu_mul(normed, lw.gate_up, gate_up, act);
    } else {
      ops::linear(o_in, lw.o_proj, tmp);
      const ops::ResidualNorm mlp_in{tmp, residual, lw.post_norm, eps, normed};
      // With the next norm pending, down writes tmp alone: one op, so that on CUDA SiLU-and-multiply may
      // quantize act for a W8A8 down projection (ops/linear.h: swiglu_mlp).
      if (pending) {
        ops::swiglu_mlp(mlp_in, lw.gate_up, lw.down, gate_up, act, tmp);
      } else {
        ops::linear_silu_mul(mlp_in, lw.gate_up, gate_up, act);
      }
    }
    if (!pending) project(act, lw.down, next_norm);
    if (l < w.vis_layers) {  // deepstack: onto the layer's output, then the next norm again
      ops::scatter_rows(residual, w.vis_rows_v, w.vis_deep_v[size_t(l)], /*accumulate=*/true);
      ops::rms_norm(residual, next_norm, eps, normed);
    }
  }
}

void Qwen3Model::forward(const BatchDesc& batch, KvCache& cache, const Tensor& logits,
                         const VisualInput* visual) {
  const int64_t R = int64_t(batch.logit_rows.size());
  KILN_CHECK(logits.ndim == 2 && logits.dtype == DType::f32 && logits.shape[0] == R &&
                 logits.shape[1] == cfg_.vocab_size && logits.device == device(),
             "logits must be f32 [", R, ", ", cfg_.vocab_size, "] on ", device_name(device()), ", got ",
             logits.describe());
  KILN_CHECK(weights_.lm_head.data != nullptr,
             "this embedding checkpoint has no LM head: it gives hidden states "
             "(forward_hidden), not logits");
  run_layers(batch, cache, visual);
  if (R > 0) launch_lm_head(logits);
}

int64_t Qwen3Model::verify_tactic_rows() const {
  const ops::PagedAttentionArgs& att = ws_->att;
  return att.decode_rows_per_seq >= 2 ? att.cu_q.shape[0] - 1 : 0;
}

void Qwen3Model::launch_lm_head(const Tensor& logits) {
  const ops::LinearTacticRows tactics(device(), verify_tactic_rows());
  if (tp_)
    return tp_lm_head(*tp_, ws_->final_hidden, ws_->rows_t, weights_.lm_head, ws_->tp_logits_v, logits);
  ops::lm_head(ws_->final_hidden, ws_->rows_t, weights_.lm_head, logits);
}

void Qwen3Model::lm_head_rows(const Tensor& rows, const Tensor& logits) {
  KILN_CHECK(!tp_, "lm_head_rows: not on a tensor-parallel shard");
  KILN_CHECK(weights_.lm_head.data != nullptr && ws_->final_hidden.data != nullptr,
             "lm_head_rows: needs an LM head and a forward before it");
  const ops::LinearTacticRows tactics(device(), verify_tactic_rows());
  ops::lm_head(ws_->final_hidden, rows, weights_.lm_head, logits);
}

void Qwen3Model::reserve_workspace(int64_t tokens, int64_t seqs, int64_t pages_stride, int64_t logit_rows) {
  KILN_CHECK(tokens >= 0 && seqs >= 0 && pages_stride >= 0 && logit_rows >= 0,
             "reserve_workspace: negative size");
  const ModelConfig& c = cfg_;
  Workspace& w = *ws_;
  const size_t T = size_t(tokens);
  w.get(Workspace::ids, T * 4);
  w.get(Workspace::positions, 3 * T * 4);  // M-RoPE: three rows
  w.get(Workspace::slots, T * 8);
  w.get(Workspace::cu_q, size_t(seqs + 1) * 4);
  w.get(Workspace::kv_lens, size_t(seqs) * 4);
  w.get(Workspace::page_table, size_t(seqs) * size_t(pages_stride) * 4);
  w.get(Workspace::rows, size_t(logit_rows) * 4);
  // A token-tree step's fields too: their first upload would otherwise reallocate and stale every graph.
  w.get(Workspace::tree_window, size_t(seqs) * 4);
  w.get(Workspace::tree_mask, T * 8);
  for (int s = Workspace::residual; s <= Workspace::act; ++s) w.activation(Workspace::Slot(s), c, tokens);
  if (tp_) {
    if (tp_->reduce == dist::ReduceType::f32) w.get(Workspace::tp_partial, T * size_t(c.hidden_size) * 4);
    w.get(Workspace::tp_logits, size_t(tp_gathered_elems(*tp_, logit_rows)) * 4);
  }
  if (const int64_t moe_bytes = moe_scratch_bytes(weights_, c, tokens, device()); moe_bytes > 0)
    w.get(Workspace::moe, size_t(moe_bytes));
  if (!aux_layers_.empty()) w.reserve_aux(tokens, c.hidden_size);
}

void Qwen3Model::set_aux_capture(const std::vector<int32_t>& layers) {
  KILN_CHECK(layers.empty() || layers.size() == 3, "aux capture takes 3 layers, got ", layers.size());
  KILN_CHECK(layers.empty() || !tp_, "EAGLE-3 features are not captured on a tensor-parallel shard");
  for (int32_t l : layers)
    KILN_CHECK(l >= 0 && l < cfg_.num_layers, "aux capture layer ", l, " outside the model's ",
               cfg_.num_layers, " layers");
  aux_layers_ = layers;
}

Tensor Qwen3Model::aux_hidden() const {
  KILN_CHECK(!aux_layers_.empty() && ws_->aux_v.data != nullptr, "aux_hidden: no step captured features");
  return ws_->aux_v;
}

uint64_t Qwen3Model::workspace_generation() const {
  return ws_->generation;
}

void Qwen3Model::forward_hidden(const BatchDesc& batch, KvCache& cache, const Tensor& out,
                                const VisualInput* visual) {
  const int64_t R = int64_t(batch.logit_rows.size());
  KILN_CHECK(out.ndim == 2 && (out.dtype == DType::f32 || out.dtype == DType::bf16) && out.shape[0] == R &&
                 out.shape[1] == cfg_.hidden_size && out.device == device(),
             "hidden out must be bf16 or f32 [", R, ", ", cfg_.hidden_size, "] on ", device_name(device()),
             ", got ", out.describe());
  run_layers(batch, cache, visual);
  if (R > 0) ops::embedding(ws_->final_hidden, ws_->rows_t, out);
}

}  // namespace kiln
