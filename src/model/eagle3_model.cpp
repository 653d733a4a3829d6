// EAGLE-3 draft on the ops API (see eagle3_model.h).
#include "model/eagle3_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/safetensors.h"
#include "kiln/staged_upload.h"
#include "model/eagle3_draft_graphs.h"
#include "model/qwen3.h"
#include "model/slot_buffers.h"
#include "ops/argmax.h"
#include "ops/attention.h"
#include "ops/attn_prep.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "ops/rope_table.h"
#include "ops/stream.h"

#ifdef KILN_HAVE_CUDA
#include <cstdio>
#include <cstdlib>

#include "ops/cuda/context.h"
#include "ops/cuda/gemm.h"
#endif

namespace kiln {
namespace {

struct Part {
  std::string name;
  std::vector<int64_t> shape;  // [n] or [rows, cols]
};

// The named tensors (bf16 or f32 in the file), checked against their shapes and stacked by rows into one
// bf16 matrix on `dev` (a single part: that tensor, 1-D or 2-D as given).
Tensor stacked(const Checkpoint& ck, const std::vector<Part>& parts, Device dev, std::vector<Buffer>& owned) {
  std::vector<bf16_t> host;
  int64_t rows = 0;
  for (const Part& p : parts) {
    KILN_CHECK(ck.has(p.name), "EAGLE-3 draft: tensor '", p.name, "' is missing");
    const Tensor t = ck.get(p.name);
    KILN_CHECK(t.dtype == DType::bf16 || t.dtype == DType::f32, "EAGLE-3 draft: '", p.name,
               "' must be bf16 or f32, got ", t.describe());
    KILN_CHECK(t.ndim == int(p.shape.size()) && std::equal(p.shape.begin(), p.shape.end(), t.shape.begin()),
               "EAGLE-3 draft: '", p.name, "' has shape ", t.describe());
    const size_t n = size_t(t.numel());
    if (t.dtype == DType::bf16) {
      const auto* s = static_cast<const bf16_t*>(t.data);
      host.insert(host.end(), s, s + n);
    } else {
      const auto* s = static_cast<const float*>(t.data);
      for (size_t i = 0; i < n; ++i) host.push_back(f32_to_bf16(s[i]));
    }
    rows += p.shape[0];
  }
  owned.emplace_back(host.size() * sizeof(bf16_t), dev);
  copy_bytes(owned.back().data(), dev, host.data(), Device::cpu(), host.size() * sizeof(bf16_t));
  if (parts.size() == 1 && parts[0].shape.size() == 1)
    return Tensor(owned.back().data(), DType::bf16, {rows}, dev);
  return Tensor(owned.back().data(), DType::bf16, {rows, parts[0].shape[1]}, dev);
}

// CUDA: the draft's GEMM shapes (M up to 64; the LM head's up to 32 rows, a verify step's chains) tuned like
// the target's (model/cuda_tune.h) when the tactic cache lacks its M = 1 QKV shape, so one-row passes get the
// tuner's GEMV rather than the cuBLASLt heuristic. KILN_AUTOTUNE=0 turns it off.
void autotune_draft_if_needed(const Eagle3Config& c) {
#ifdef KILN_HAVE_CUDA
  if (const char* e = std::getenv("KILN_AUTOTUNE"); e && std::strcmp(e, "0") == 0) return;
  cuda::GemmEngine& eng = cuda::gemm_engine();
  const int64_t H = c.hidden, qkv = (c.heads + 2 * c.kv_heads) * c.head_dim;
  if (eng.tactics().count(cuda::GemmShape{1, qkv, 2 * H, cuda::GemmOut::bf16})) return;
  std::vector<cuda::GemmShape> shapes;
  // Only shapes without a tactic: one the target shares (its MLP's, often) keeps the target's tactic, so
  // loading a draft never changes the target's GEMMs (nor its greedy tokens).
  const auto want = [&](cuda::GemmShape g) {
    if (!eng.tactics().count(g)) shapes.push_back(g);
  };
  for (int64_t mb = 1; mb <= 64; mb *= 2) {
    want({mb, H, 3 * c.target_hidden, cuda::GemmOut::bf16});
    want({mb, qkv, 2 * H, cuda::GemmOut::bf16});
    want({mb, H, c.heads * c.head_dim, cuda::GemmOut::bf16});
    want({mb, 2 * c.intermediate, H, cuda::GemmOut::bf16});
    want({mb, H, c.intermediate, cuda::GemmOut::bf16});
    if (mb <= 32) want({mb, c.draft_vocab, H, cuda::GemmOut::f32});
  }
  const std::string path = cuda::default_tactic_cache_path();
  std::fprintf(stderr, "kiln: tuning cuBLASLt GEMM tactics for the EAGLE-3 draft's shapes (once; cache %s)\n",
               path.c_str());
  eng.tune(shapes);
  try {
    eng.save(path);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "kiln: could not save the tactic cache: %s\n", ex.what());
  }
#else
  (void)c;
#endif
}

// A pass's output buffer over R logit rows with a top k (f32 elements): the logits [R, Dv], then, from a
// multiple of 4 floats (the CUDA gather stores 16 bytes at a time and R x Dv need not be a multiple of 4: one
// chain row of a small draft vocabulary), what read_out copies back in one copy: the midlayer outputs [R, H],
// the tokens [R, k] (i32; k = 1: the top-1 tokens) and, for k > 1, their log-probabilities [R, k].
struct OutLayout {
  int64_t hidden, tokens, logprobs, end;
};

OutLayout out_layout(int64_t R, int64_t draft_vocab, int64_t H, int64_t k) {
  OutLayout o;
  o.hidden = (R * draft_vocab + 3) / 4 * 4;
  o.tokens = o.hidden + R * H;
  o.logprobs = o.tokens + R * k;
  o.end = o.logprobs + (k > 1 ? R * k : 0);
  return o;
}

// The fewest rows any sequence of the pass computes (launch_midlayer's host bound).
int32_t shortest_q_len(const BatchDesc& b) {
  int32_t n = std::numeric_limits<int32_t>::max();
  for (int32_t s = 0; s < b.num_seqs(); ++s) n = std::min(n, b.q_len(s));
  return n;
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p);
  KILN_CHECK(f.good(), "EAGLE-3 draft: cannot read ", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

// Per-pass buffers on the model's device (model/slot_buffers.h), grown to the largest pass seen.
struct Eagle3Model::Workspace : SlotBuffers {
  enum Slot {
    ids,
    positions,
    slots,
    cu_q,
    kv_lens,
    page_table,
    rows,
    src_rows,
    input,
    residual,
    x,
    qkv,
    attn,
    tmp,
    normed,
    gate_up,
    act,
    out,
    chain_tokens,  // i32 [passes, R]: forward_chain's tokens, each pass's the next pass's ids
    // forward_chain's per-pass inputs, every pass's one after another (stage_chain)
    chain_positions,
    chain_slots,
    chain_kv_lens,
    chain_page_table,
    tree_window,  // i32 [B], a tree pass's (stage)
    tree_mask,    // i64 [T]
    num_slots
  };
  explicit Workspace(Device d) : SlotBuffers(d, num_slots) {}
  Tensor act_rows(Slot s, int64_t T, int64_t cols) {
    return Tensor(get(s, size_t(std::max<int64_t>(T, 1) * cols) * sizeof(bf16_t)), DType::bf16, {T, cols},
                  device);
  }
  std::vector<float> host_out;
  Tensor ids_t, pos_t, slots_t, cu_t, kv_lens_t, pt_t, rows_t, src_t;
  Tensor tree_window_t, tree_mask_t;  // empty unless the staged pass has a token tree
  // stage_chain's views: pass 0's tokens, the passes' inputs, and each pass's page-table width and offset.
  struct Chain {
    Tensor ids0;
    int32_t *pos = nullptr, *kv_lens = nullptr, *pt = nullptr, *tokens = nullptr;
    int64_t* slots = nullptr;
    std::vector<int32_t> stride;
    std::vector<int64_t> pt_at;
  } chain;
};

Eagle3Model::~Eagle3Model() = default;  // draft_graphs_ first: its graphs use the workspace

uint64_t Eagle3Model::ws_generation() const {
  return ws_->generation;
}

std::unique_ptr<Eagle3Model> Eagle3Model::load(const std::string& dir, const Qwen3Model& target) {
  namespace fs = std::filesystem;
  std::unique_ptr<Eagle3Model> m(new Eagle3Model());
  const fs::path cfg_path = fs::path(dir) / "config.json";
  m->cfg_ = parse_eagle3_config(read_text(cfg_path), cfg_path.string());
  const Eagle3Config& c = m->cfg_;
  const ModelConfig& tc = target.config();
  KILN_CHECK(c.vocab == tc.vocab_size, cfg_path.string(), ": vocab_size ", c.vocab, " is not the target's ",
             tc.vocab_size);
  KILN_CHECK(c.target_hidden == tc.hidden_size, cfg_path.string(), ": target_hidden_size ", c.target_hidden,
             " is not the target's hidden size ", tc.hidden_size);
  KILN_CHECK(c.head_dim % 8 == 0 && c.head_dim <= 256, cfg_path.string(), ": head_dim ", c.head_dim,
             " (kiln's attention takes a multiple of 8 up to 256)");
  m->aux_layers_ = eagle3_aux_layers(c, tc.num_layers);
  m->device_ = target.device();
  m->max_position_ = target.max_position();
  m->ws_ = std::make_unique<Workspace>(m->device_);
  const Checkpoint ck = Checkpoint::open(dir);
  const int64_t H = c.hidden, I = c.intermediate, qd = c.heads * c.head_dim, kd = c.kv_heads * c.head_dim;
  const Device dev = m->device_;
  auto& own = m->owned_;
  m->fc_ = stacked(ck, {{"fc.weight", {H, 3 * c.target_hidden}}}, dev, own);
  m->w_in_ = stacked(ck, {{"midlayer.input_layernorm.weight", {H}}}, dev, own);
  m->w_hidden_ = stacked(ck, {{"midlayer.hidden_norm.weight", {H}}}, dev, own);
  m->qkv_ = stacked(ck,
                    {{"midlayer.self_attn.q_proj.weight", {qd, 2 * H}},
                     {"midlayer.self_attn.k_proj.weight", {kd, 2 * H}},
                     {"midlayer.self_attn.v_proj.weight", {kd, 2 * H}}},
                    dev, own);
  m->o_ = stacked(ck, {{"midlayer.self_attn.o_proj.weight", {H, qd}}}, dev, own);
  m->w_post_ = stacked(ck, {{"midlayer.post_attention_layernorm.weight", {H}}}, dev, own);
  m->gate_up_ = stacked(
      ck, {{"midlayer.mlp.gate_proj.weight", {I, H}}, {"midlayer.mlp.up_proj.weight", {I, H}}}, dev, own);
  m->down_ = stacked(ck, {{"midlayer.mlp.down_proj.weight", {H, I}}}, dev, own);
  m->w_norm_ = stacked(ck, {{"norm.weight", {H}}}, dev, own);
  m->lm_head_ = stacked(ck, {{"lm_head.weight", {c.draft_vocab, H}}}, dev, own);
  if (ck.has("embed_tokens.weight")) {
    m->embed_ = stacked(ck, {{"embed_tokens.weight", {c.vocab, H}}}, dev, own);
  } else {
    KILN_CHECK(H == tc.hidden_size && target.weights().embed.data != nullptr,
               "EAGLE-3 draft without embed_tokens.weight: its hidden size ", H,
               " must be the target's (the embeddings are shared), got ", tc.hidden_size);
    m->embed_ = target.weights().embed;
  }
  KILN_CHECK(ck.has("d2t"), "EAGLE-3 draft: tensor 'd2t' is missing");
  const Tensor t = ck.get("d2t", DType::i64, {c.draft_vocab});
  const std::vector<int64_t> d2t(static_cast<const int64_t*>(t.data),
                                 static_cast<const int64_t*>(t.data) + c.draft_vocab);
  for (int64_t i = 0; i < c.draft_vocab; ++i)
    KILN_CHECK(i + d2t[size_t(i)] >= 0 && i + d2t[size_t(i)] < c.vocab, "EAGLE-3 draft: d2t[", i,
               "] maps outside the target vocabulary of ", c.vocab);
  m->owned_.emplace_back(d2t.size() * sizeof(int64_t), dev);
  copy_bytes(m->owned_.back().data(), dev, d2t.data(), Device::cpu(), d2t.size() * sizeof(int64_t));
  m->d2t_dev_ = Tensor(m->owned_.back().data(), DType::i64, {c.draft_vocab}, dev);
  if (dev.is_cuda()) autotune_draft_if_needed(c);
  m->rope_ = ops::build_rope_table(int(c.head_dim), c.rope_theta, m->max_position_, dev);
  m->kv_cfg_.num_layers = 1;
  m->kv_cfg_.num_kv_heads = c.kv_heads;
  m->kv_cfg_.num_heads = c.heads;
  m->kv_cfg_.head_dim = c.head_dim;
  m->kv_cfg_.hidden_size = H;
  return m;
}

void Eagle3Model::allocate_kv(int32_t num_pages, int32_t page_size, ops::KvLayout layout) {
  cache_ = std::make_unique<KvCache>(kv_cfg_, num_pages, page_size, layout, DType::bf16, device_);
}

int64_t Eagle3Model::kv_bytes_per_token() const {
  return KvCache::bytes_per_token(kv_cfg_, DType::bf16);
}

void Eagle3Model::move_kv(const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
  KILN_CHECK(cache_ != nullptr, "Eagle3Model: allocate_kv was not called");
  cache_->move_slots(from, to);
}

void Eagle3Model::set_topk(int k) {
  KILN_CHECK(k >= 1 && k <= ops::kMaxTopk, "EAGLE-3 draft top-k must be in [1, ", ops::kMaxTopk, "], got ",
             k);
  KILN_CHECK(k <= cfg_.draft_vocab, "EAGLE-3 draft top-k ", k, " exceeds the draft vocabulary of ",
             cfg_.draft_vocab);
  topk_ = k;
}

void Eagle3Model::stage(const BatchDesc& b, const std::vector<int32_t>* src_rows,
                        const std::vector<bf16_t>* hidden) {
  KILN_CHECK(cache_ != nullptr, "Eagle3Model: allocate_kv was not called");
  b.validate(cfg_.vocab, cache_->num_pages());
  KILN_CHECK_EQ(b.page_size, cache_->page_size(), "draft batch page size vs the draft's KV cache");
  for (int32_t p : b.positions)
    KILN_CHECK(p >= 0 && p < max_position_, "draft position ", p, " outside [0, ", max_position_, ")");
  Workspace& w = *ws_;
  const Device dev = device_;
  const int64_t T = b.num_tokens(), B = b.num_seqs(), R = int64_t(b.logit_rows.size());
  const auto fp = [](const auto& v) { return StagedUploads::footprint(v.size() * sizeof(v[0])); };
  w.staged.begin(fp(b.tokens) + fp(b.positions) + fp(b.slot_mapping) + fp(b.cu_q) + fp(b.kv_lens) +
                     fp(b.page_table) + fp(b.logit_rows) + (src_rows ? fp(*src_rows) : 0) +
                     (hidden ? fp(*hidden) : 0) + fp(b.tree_window) + fp(b.tree_mask),
                 ops::current_stream());
  if (src_rows) w.src_t = Tensor(w.stage_input(Workspace::src_rows, *src_rows), DType::i32, {T}, dev);
  if (hidden) w.stage_input(Workspace::residual, *hidden);
  w.ids_t = Tensor(w.stage_input(Workspace::ids, b.tokens), DType::i32, {T}, dev);
  w.pos_t = Tensor(w.stage_input(Workspace::positions, b.positions), DType::i32, {T}, dev);
  w.slots_t = Tensor(w.stage_input(Workspace::slots, b.slot_mapping), DType::i64, {T}, dev);
  w.cu_t = Tensor(w.stage_input(Workspace::cu_q, b.cu_q), DType::i32, {B + 1}, dev);
  w.kv_lens_t = Tensor(w.stage_input(Workspace::kv_lens, b.kv_lens), DType::i32, {B}, dev);
  w.pt_t = Tensor(w.stage_input(Workspace::page_table, b.page_table), DType::i32, {B, b.pages_stride}, dev);
  w.rows_t = Tensor(w.stage_input(Workspace::rows, b.logit_rows), DType::i32, {R}, dev);
  w.tree_window_t = w.tree_mask_t = Tensor();
  if (b.has_tree()) {
    w.tree_window_t = Tensor(w.stage_input(Workspace::tree_window, b.tree_window), DType::i32, {B}, dev);
    w.tree_mask_t = Tensor(w.stage_input(Workspace::tree_mask, b.tree_mask), DType::i64, {T}, dev);
  }
  w.staged.end();
}

void Eagle3Model::forward_features(const BatchDesc& b, const Tensor& features,
                                   const std::vector<int32_t>& rows, Out* out) {
  const int64_t T = b.num_tokens();
  KILN_CHECK_EQ(int64_t(rows.size()), T, "EAGLE-3: one feature row per draft row");
  KILN_CHECK(features.ndim == 2 && features.dtype == DType::bf16 &&
                 features.shape[1] == 3 * cfg_.target_hidden && features.device == device_,
             "EAGLE-3 features must be bf16 [N, ", 3 * cfg_.target_hidden, "] on ", device_name(device_),
             ", got ", features.describe());
  for (int32_t r : rows)
    KILN_CHECK(r >= 0 && r < features.shape[0], "EAGLE-3: feature row ", r, " outside [0, ",
               features.shape[0], ")");
  if (run_extend_graph(b, features, rows, out)) return;
  stage(b, &rows, nullptr);
  if (T == 0) {
    run_midlayer(b, out);
    return;
  }
  const int32_t min_q_len = shortest_q_len(b);
  launch_features(features, T, int64_t(b.logit_rows.size()), min_q_len);
  read_out(int64_t(b.logit_rows.size()), out);
}

void Eagle3Model::launch_features(const Tensor& features, int64_t T, int64_t R, int32_t min_q_len) {
  Workspace& w = *ws_;
  const Tensor in = w.act_rows(Workspace::input, T, 3 * cfg_.target_hidden);
  const Tensor residual = w.act_rows(Workspace::residual, T, cfg_.hidden);
  ops::embedding(features, w.src_t, in);
  ops::linear(in, fc_, residual);
  launch_midlayer(T, R, min_q_len);
}

void Eagle3Model::forward_hidden(const BatchDesc& b, const std::vector<float>& hidden, Out* out) {
  const int64_t T = b.num_tokens(), H = cfg_.hidden;
  KILN_CHECK_EQ(int64_t(hidden.size()), T * H, "EAGLE-3: hidden states must be [T, H]");
  std::vector<bf16_t> h(hidden.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(hidden[i]);
  stage(b, nullptr, &h);
  run_midlayer(b, out);
}

void Eagle3Model::forward_chain(const std::vector<BatchDesc>& passes, const std::vector<float>& hidden,
                                std::vector<std::vector<int32_t>>* tokens) {
  tokens->assign(passes.size(), {});
  if (passes.empty()) return;
  const int64_t R = passes[0].num_seqs(), H = cfg_.hidden;
  KILN_CHECK_EQ(int64_t(hidden.size()), R * H, "EAGLE-3 chain: hidden states must be [R, H]");
  for (const BatchDesc& b : passes) {
    KILN_CHECK(b.num_seqs() == R && b.num_tokens() == R && int64_t(b.logit_rows.size()) == R,
               "EAGLE-3 chain: every pass has the first pass's ", R,
               " sequences, one row and logit row each");
    for (int64_t r = 0; r < R; ++r)
      KILN_CHECK_EQ(b.logit_rows[size_t(r)], int32_t(r), "EAGLE-3 chain: logit rows must be 0 .. R - 1");
    KILN_CHECK(!b.has_tree(), "EAGLE-3 chain passes take no token tree (a tree pass: forward_hidden)");
  }
  if (R == 0) return;
  std::vector<bf16_t> h(hidden.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(hidden[i]);
  if (run_chain_graph(passes, h, tokens)) return;
  stage_chain(passes, h);
  launch_chain(R, passes.size());
  read_chain(R, R, passes.size(), tokens);
}

void Eagle3Model::stage_chain(const std::vector<BatchDesc>& passes, const std::vector<bf16_t>& hidden) {
  KILN_CHECK(cache_ != nullptr, "Eagle3Model: allocate_kv was not called");
  const BatchDesc& first = passes[0];
  const size_t n = passes.size();
  const int64_t R = first.num_seqs();
  std::vector<int32_t> pos, kv_lens, pt;
  std::vector<int64_t> slots;
  Workspace& w = *ws_;
  Workspace::Chain& c = w.chain;
  c.stride.clear();
  c.pt_at.clear();
  for (const BatchDesc& b : passes) {
    b.validate(cfg_.vocab, cache_->num_pages());
    KILN_CHECK_EQ(b.page_size, cache_->page_size(), "draft batch page size vs the draft's KV cache");
    KILN_CHECK(b.cu_q == first.cu_q, "EAGLE-3 chain: every pass has one row per sequence");
    for (int32_t p : b.positions)
      KILN_CHECK(p >= 0 && p < max_position_, "draft position ", p, " outside [0, ", max_position_, ")");
    pos.insert(pos.end(), b.positions.begin(), b.positions.end());
    slots.insert(slots.end(), b.slot_mapping.begin(), b.slot_mapping.end());
    kv_lens.insert(kv_lens.end(), b.kv_lens.begin(), b.kv_lens.end());
    c.stride.push_back(b.pages_stride);
    c.pt_at.push_back(int64_t(pt.size()));
    pt.insert(pt.end(), b.page_table.begin(), b.page_table.end());
  }
  const auto fp = [](const auto& v) { return StagedUploads::footprint(v.size() * sizeof(v[0])); };
  w.staged.begin(fp(first.tokens) + fp(first.cu_q) + fp(first.logit_rows) + fp(pos) + fp(slots) +
                     fp(kv_lens) + fp(pt) + fp(hidden),
                 ops::current_stream());
  const Device dev = device_;
  w.stage_input(Workspace::residual, hidden);
  c.ids0 = Tensor(w.stage_input(Workspace::ids, first.tokens), DType::i32, {R}, dev);
  w.cu_t = Tensor(w.stage_input(Workspace::cu_q, first.cu_q), DType::i32, {R + 1}, dev);
  w.rows_t = Tensor(w.stage_input(Workspace::rows, first.logit_rows), DType::i32, {R}, dev);
  c.pos = static_cast<int32_t*>(w.stage_input(Workspace::chain_positions, pos));
  c.slots = static_cast<int64_t*>(w.stage_input(Workspace::chain_slots, slots));
  c.kv_lens = static_cast<int32_t*>(w.stage_input(Workspace::chain_kv_lens, kv_lens));
  c.pt = static_cast<int32_t*>(w.stage_input(Workspace::chain_page_table, pt));
  w.staged.end();
  w.tree_window_t = w.tree_mask_t = Tensor();
  // Sized before the first pass: the slot must not move while a later pass reads an earlier pass's tokens.
  c.tokens = static_cast<int32_t*>(w.get(Workspace::chain_tokens, n * size_t(R) * sizeof(int32_t)));
}

void Eagle3Model::launch_chain(int64_t R, size_t passes) {
  Workspace& w = *ws_;
  const Workspace::Chain& c = w.chain;
  const Device dev = device_;
  for (size_t j = 0; j < passes; ++j) {
    const int64_t at = int64_t(j) * R;
    w.ids_t = j == 0 ? c.ids0 : Tensor(c.tokens + at - R, DType::i32, {R}, dev);
    w.pos_t = Tensor(c.pos + at, DType::i32, {R}, dev);
    w.slots_t = Tensor(c.slots + at, DType::i64, {R}, dev);
    w.kv_lens_t = Tensor(c.kv_lens + at, DType::i32, {R}, dev);
    w.pt_t = Tensor(c.pt + c.pt_at[j], DType::i32, {R, c.stride[j]}, dev);
    // pass j > 0: the residual holds pass j - 1's outputs
    launch_midlayer(R, R, 1, c.tokens + at, /*hidden_rows=*/false);
  }
}

void Eagle3Model::read_chain(int64_t rows, int64_t R, size_t passes,
                             std::vector<std::vector<int32_t>>* tokens) {
  std::vector<int32_t> host(passes * size_t(rows));
  copy_bytes(host.data(), Device::cpu(), ws_->chain.tokens, device_, host.size() * sizeof(int32_t));
  KILN_CHECK(R >= 0 && R <= rows, "Eagle3Model::read_chain: ", R, " rows of ", rows);
  tokens->assign(passes, std::vector<int32_t>(size_t(R)));
  // An element loop: GCC 13 cannot bound R through vector::assign's memmove (-Wstringop-overread).
  for (size_t j = 0; j < passes; ++j)
    for (size_t i = 0; i < size_t(R); ++i) (*tokens)[j][i] = host[j * size_t(rows) + i];
}

void Eagle3Model::run_midlayer(const BatchDesc& b, Out* out) {
  const int64_t T = b.num_tokens(), R = int64_t(b.logit_rows.size());
  if (T == 0) {  // then R == 0 too: logit rows are token rows
    read_out(0, out);
    return;
  }
  const int32_t min_q_len = shortest_q_len(b);
  launch_midlayer(T, R, min_q_len);
  read_out(R, out);
}

void Eagle3Model::launch_midlayer(int64_t T, int64_t R, int32_t min_q_len, int32_t* tokens,
                                  bool hidden_rows) {
  Workspace& w = *ws_;
  const Eagle3Config& c = cfg_;
  const int64_t H = c.hidden, I = c.intermediate, D = c.head_dim, Hq = c.heads, Hkv = c.kv_heads;
  const int64_t Dv = c.draft_vocab, qkv_dim = (Hq + 2 * Hkv) * D;
  const float eps = float(c.eps);
  const Tensor residual = w.act_rows(Workspace::residual, T, H);
  const Tensor x = w.act_rows(Workspace::x, T, 2 * H);
  const Tensor qkv = w.act_rows(Workspace::qkv, T, qkv_dim);
  const Tensor attn(w.get(Workspace::attn, size_t(T * Hq * D) * 2), DType::bf16, {T, Hq, D}, device_);
  const Tensor tmp = w.act_rows(Workspace::tmp, T, H);
  const Tensor normed = w.act_rows(Workspace::normed, T, H);
  const Tensor gate_up = w.act_rows(Workspace::gate_up, T, 2 * I);
  const Tensor act = w.act_rows(Workspace::act, T, I);
  // x = cat(rms(embed(token)) * w_in, rms(hidden) * w_hidden): the two norms write the halves of each row.
  ops::embedding(embed_, w.ids_t, tmp);
  ops::rms_norm(tmp, w_in_, eps, Tensor::strided(x.data, DType::bf16, {T, H}, {2 * H, 1}, device_));
  ops::rms_norm(residual, w_hidden_, eps,
                Tensor::strided(static_cast<bf16_t*>(x.data) + H, DType::bf16, {T, H}, {2 * H, 1}, device_));
  ops::linear(x, qkv_, qkv);
  ops::AttnPrepArgs prep;  // Llama attention: no per-head norm (q_norm / k_norm empty)
  prep.qkv = qkv;
  prep.eps = eps;
  prep.positions = w.pos_t;
  prep.rope = ops::rope_table_view(rope_, int(D), max_position_);
  prep.slot_mapping = w.slots_t;
  prep.cache = cache_->layer(0);
  prep.num_q_heads = int(Hq);
  prep.num_kv_heads = int(Hkv);
  prep.head_dim = int(D);
  prep.stream =
      ops::current_stream();  // the draft graphs' stream while they capture (eagle3_draft_graphs.cpp)
  ops::attn_prep(prep);
  ops::PagedAttentionArgs att;
  att.q = Tensor::strided(qkv.data, DType::bf16, {T, Hq, D}, {qkv_dim, D, 1}, device_);
  att.cache = prep.cache;
  att.cu_q = w.cu_t;
  att.kv_lens = w.kv_lens_t;
  att.page_table = w.pt_t;
  att.out = attn;
  att.scale = float(1.0 / std::sqrt(double(D)));
  att.min_q_len = min_q_len;
  att.tree_window = w.tree_window_t;
  att.tree_mask = w.tree_mask_t;
  ops::paged_attention(att);
  ops::linear_add_rms_norm(attn.reshape({T, Hq * D}), o_, residual, w_post_, eps, tmp, normed);
  ops::linear_silu_mul(normed, gate_up_, gate_up, act);
  ops::linear_add_rms_norm(act, down_, residual, w_norm_, eps, tmp, normed);
  if (R == 0) return;
  const int64_t k = tokens ? 1 : topk_;  // a chain pass (its tokens on the device) stays top-1
  const OutLayout L = out_layout(R, Dv, H, k);
  auto* buf = static_cast<float*>(w.get(Workspace::out, size_t(L.end) * 4));
  const Tensor logits(buf, DType::f32, {R, Dv}, device_);
  ops::lm_head(normed, w.rows_t, lm_head_, logits);
  if (!tokens) tokens = reinterpret_cast<int32_t*>(buf + L.tokens);
  if (k > 1) {  // one launch: its entry 0 is the top-1 token (the same ranking as argmax_rows)
    ops::topk_rows(logits, d2t_dev_, int(k), Tensor(tokens, DType::i32, {R, k}, device_),
                   Tensor(buf + L.logprobs, DType::f32, {R, k}, device_));
  } else {
    ops::argmax_rows(logits, d2t_dev_, Tensor(tokens, DType::i32, {R}, device_));
  }
  if (hidden_rows) ops::embedding(residual, w.rows_t, Tensor(buf + L.hidden, DType::f32, {R, H}, device_));
}

void Eagle3Model::read_out(int64_t R, Out* out, int64_t keep) {
  Workspace& w = *ws_;
  const int64_t H = cfg_.hidden, Dv = cfg_.draft_vocab, k = topk_;
  keep = keep < 0 ? R : keep;
  KILN_CHECK(keep <= R, "Eagle3Model::read_out: ", keep, " rows of ", R);
  out->tokens.assign(size_t(keep), -1);
  out->hidden.assign(size_t(keep * H), 0.0f);
  out->logits.assign(return_logits_ ? size_t(keep * Dv) : 0, 0.0f);
  out->topk_tokens.assign(k > 1 ? size_t(keep * k) : 0, -1);
  out->topk_logprobs.assign(k > 1 ? size_t(keep * k) : 0, 0.0f);
  if (keep == 0) return;
  const OutLayout L = out_layout(R, Dv, H, k);
  const float* buf = static_cast<const float*>(w.get(Workspace::out, size_t(L.end) * 4));
  std::vector<float>& host = w.host_out;  // [L.hidden, L.end): the hidden rows, the tokens' bits, log-probs
  host.resize(size_t(L.end - L.hidden));
  copy_bytes(host.data(), Device::cpu(), buf + L.hidden, device_, host.size() * 4);
  const float* at = host.data();
  std::copy(at, at + keep * H, out->hidden.begin());
  if (k > 1) {
    std::memcpy(out->topk_tokens.data(), at + (L.tokens - L.hidden), size_t(keep * k) * sizeof(int32_t));
    std::copy(at + (L.logprobs - L.hidden), at + (L.logprobs - L.hidden) + keep * k,
              out->topk_logprobs.begin());
    for (int64_t r = 0; r < keep; ++r) out->tokens[size_t(r)] = out->topk_tokens[size_t(r * k)];
  } else {
    std::memcpy(out->tokens.data(), at + (L.tokens - L.hidden), size_t(keep) * sizeof(int32_t));
  }
  if (return_logits_) copy_bytes(out->logits.data(), Device::cpu(), buf, device_, out->logits.size() * 4);
}

}  // namespace kiln
