// EAGLE-3 draft on the CPU (see eagle3.h).
#include "model/eagle3.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/safetensors.h"

namespace kiln {
namespace {

using nlohmann::json;

int64_t positive(const json& j, const char* key, const std::string& src, int64_t fallback = -1) {
  if (!j.contains(key)) {
    KILN_CHECK(fallback > 0, src, ": '", key, "' is missing");
    return fallback;
  }
  KILN_CHECK(j[key].is_number_integer() && j[key].get<int64_t>() > 0, src, ": '", key,
             "' must be a positive integer");
  return j[key].get<int64_t>();
}

// A tensor of the checkpoint widened to f32, checked against `shape`.
std::vector<float> widen(const Checkpoint& ck, const std::string& name,
                         std::initializer_list<int64_t> shape) {
  KILN_CHECK(ck.has(name), "EAGLE-3 draft: tensor '", name, "' is missing");
  const Tensor t = ck.get(name);
  KILN_CHECK(t.dtype == DType::bf16 || t.dtype == DType::f32, "EAGLE-3 draft: '", name,
             "' must be bf16 or f32, got ", t.describe());
  KILN_CHECK(t.ndim == int(shape.size()) && std::equal(shape.begin(), shape.end(), t.shape.begin()),
             "EAGLE-3 draft: '", name, "' has shape ", t.describe());
  std::vector<float> out(size_t(t.numel()));
  if (t.dtype == DType::f32) {
    std::copy_n(static_cast<const float*>(t.data), out.size(), out.data());
  } else {
    const auto* p = static_cast<const bf16_t*>(t.data);
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(p[i]);
  }
  return out;
}

// y[n] = sum_k w[n, k] x[k], k ascending.
void matvec(const std::vector<float>& w, const float* x, int64_t n_out, int64_t n_in, float* y) {
  for (int64_t n = 0; n < n_out; ++n) {
    const float* row = w.data() + n * n_in;
    float acc = 0.0f;
    for (int64_t k = 0; k < n_in; ++k) acc += row[k] * x[k];
    y[n] = acc;
  }
}

void rms_norm(const float* x, const std::vector<float>& w, int64_t n, double eps, float* y) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / float(n) + float(eps));
  for (int64_t i = 0; i < n; ++i) y[i] = w[size_t(i)] * (x[i] * r);
}

// NeoX half-split rotation of one head [D] at position p.
void rotate(float* x, int64_t D, int64_t p, const std::vector<float>& inv_freq) {
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; ++i) {
    const float a = float(p) * inv_freq[size_t(i)];
    const float c = std::cos(a), s = std::sin(a);
    const float x1 = x[i], x2 = x[i + h];
    x[i] = x1 * c - x2 * s;
    x[i + h] = x2 * c + x1 * s;
  }
}

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return int32_t(best);
}

}  // namespace

Eagle3Config parse_eagle3_config(const std::string& json_text, const std::string& src) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    KILN_FAIL(src, ": not JSON: ", e.what());
  }
  KILN_CHECK(j.is_object(), src, ": not a JSON object");
  bool eagle3 = false;
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"])
      eagle3 = eagle3 || (a.is_string() && a == "LlamaForCausalLMEagle3");
  KILN_CHECK(eagle3, src, ": architectures must name LlamaForCausalLMEagle3 (an EAGLE-3 draft)");
  Eagle3Config c;
  c.hidden = positive(j, "hidden_size", src);
  c.intermediate = positive(j, "intermediate_size", src);
  c.heads = positive(j, "num_attention_heads", src);
  c.kv_heads = positive(j, "num_key_value_heads", src, c.heads);
  c.head_dim = positive(j, "head_dim", src, c.hidden / c.heads);
  c.vocab = positive(j, "vocab_size", src);
  c.draft_vocab = positive(j, "draft_vocab_size", src, c.vocab);
  c.target_hidden = positive(j, "target_hidden_size", src, c.hidden);
  KILN_CHECK(c.heads % c.kv_heads == 0 && c.head_dim % 2 == 0, src, ": ", c.heads, " heads over ", c.kv_heads,
             " KV heads of dim ", c.head_dim, " (heads must be a multiple of KV heads, the dim even)");
  KILN_CHECK(c.draft_vocab <= c.vocab, src, ": draft_vocab_size ", c.draft_vocab, " > vocab_size ", c.vocab);
  if (j.contains("rms_norm_eps")) c.eps = j["rms_norm_eps"].get<double>();
  if (j.contains("rope_theta")) c.rope_theta = j["rope_theta"].get<double>();
  if (j.contains("rope_parameters") && j["rope_parameters"].contains("rope_theta"))
    c.rope_theta = j["rope_parameters"]["rope_theta"].get<double>();
  KILN_CHECK(c.eps > 0 && c.rope_theta > 0, src, ": rms_norm_eps and rope_theta must be positive");
  if (j.contains("eagle_config") && j["eagle_config"].contains("eagle_aux_hidden_state_layer_ids")) {
    const json& ids = j["eagle_config"]["eagle_aux_hidden_state_layer_ids"];
    KILN_CHECK(ids.is_array() && ids.size() == 3, src,
               ": eagle_aux_hidden_state_layer_ids must list 3 layers");
    for (const json& i : ids) {
      KILN_CHECK(i.is_number_integer() && i.get<int64_t>() >= 0, src, ": bad aux layer id ", i.dump());
      c.aux_layers.push_back(i.get<int32_t>());
    }
  }
  return c;
}

std::array<int32_t, 3> eagle3_aux_layers(const Eagle3Config& cfg, int64_t L) {
  std::array<int32_t, 3> ids{2, int32_t(L / 2), int32_t(L - 3)};
  if (!cfg.aux_layers.empty()) std::copy_n(cfg.aux_layers.begin(), 3, ids.begin());
  for (int32_t i : ids)
    KILN_CHECK(i >= 0 && i < L, "EAGLE-3: aux layer ", i, " outside the target's ", L, " layers");
  return ids;
}

void Eagle3Kv::truncate(int64_t n) {
  if (n >= len) return;
  const size_t row = len > 0 ? k.size() / size_t(len) : 0;
  k.resize(size_t(n) * row);
  v.resize(size_t(n) * row);
  len = n;
}

std::unique_ptr<Eagle3Draft> Eagle3Draft::load(const std::string& dir, std::vector<float> target_embed) {
  namespace fs = std::filesystem;
  std::ifstream f(fs::path(dir) / "config.json");
  KILN_CHECK(f.good(), "EAGLE-3 draft: cannot read ", (fs::path(dir) / "config.json").string());
  std::stringstream ss;
  ss << f.rdbuf();
  std::unique_ptr<Eagle3Draft> d(new Eagle3Draft());
  Eagle3Config& c = d->cfg_;
  c = parse_eagle3_config(ss.str(), dir + "/config.json");
  const Checkpoint ck = Checkpoint::open(dir);
  const int64_t H = c.hidden, I = c.intermediate, qd = c.heads * c.head_dim, kd = c.kv_heads * c.head_dim;
  d->fc_ = widen(ck, "fc.weight", {H, 3 * c.target_hidden});
  d->w_in_ = widen(ck, "midlayer.input_layernorm.weight", {H});
  d->w_hidden_ = widen(ck, "midlayer.hidden_norm.weight", {H});
  d->q_ = widen(ck, "midlayer.self_attn.q_proj.weight", {qd, 2 * H});
  d->k_ = widen(ck, "midlayer.self_attn.k_proj.weight", {kd, 2 * H});
  d->v_ = widen(ck, "midlayer.self_attn.v_proj.weight", {kd, 2 * H});
  d->o_ = widen(ck, "midlayer.self_attn.o_proj.weight", {H, qd});
  d->w_post_ = widen(ck, "midlayer.post_attention_layernorm.weight", {H});
  d->gate_ = widen(ck, "midlayer.mlp.gate_proj.weight", {I, H});
  d->up_ = widen(ck, "midlayer.mlp.up_proj.weight", {I, H});
  d->down_ = widen(ck, "midlayer.mlp.down_proj.weight", {H, I});
  d->w_norm_ = widen(ck, "norm.weight", {H});
  d->lm_head_ = widen(ck, "lm_head.weight", {c.draft_vocab, H});
  if (ck.has("embed_tokens.weight")) {
    d->embed_ = widen(ck, "embed_tokens.weight", {c.vocab, H});
  } else {
    KILN_CHECK(int64_t(target_embed.size()) == c.vocab * H,
               "EAGLE-3 draft without embed_tokens.weight: the target's ", "embeddings [", c.vocab, ", ", H,
               "] must be given, got ", target_embed.size(), " values");
    d->embed_ = std::move(target_embed);
  }
  KILN_CHECK(ck.has("d2t"), "EAGLE-3 draft: tensor 'd2t' is missing");
  const Tensor t = ck.get("d2t", DType::i64, {c.draft_vocab});
  d->d2t_.assign(static_cast<const int64_t*>(t.data), static_cast<const int64_t*>(t.data) + c.draft_vocab);
  for (int64_t i = 0; i < c.draft_vocab; ++i)
    KILN_CHECK(i + d->d2t_[size_t(i)] >= 0 && i + d->d2t_[size_t(i)] < c.vocab, "EAGLE-3 draft: d2t[", i,
               "] maps outside the target vocabulary of ", c.vocab);
  const int64_t D = c.head_dim;
  for (int64_t i = 0; i < D / 2; ++i)
    d->inv_freq_.push_back(float(1.0 / std::pow(c.rope_theta, double(2 * i) / double(D))));
  return d;
}

std::vector<float> Eagle3Draft::project_features(std::span<const float> features) const {
  const int64_t in = 3 * cfg_.target_hidden, H = cfg_.hidden;
  KILN_CHECK(int64_t(features.size()) % in == 0, "EAGLE-3: features must be [T, ", in, "], got ",
             features.size(), " values");
  const int64_t T = int64_t(features.size()) / in;
  std::vector<float> out(size_t(T * H));
  for (int64_t t = 0; t < T; ++t) matvec(fc_, features.data() + t * in, H, in, out.data() + t * H);
  return out;
}

int32_t Eagle3Draft::target_token(int32_t draft_id) const {
  KILN_CHECK(draft_id >= 0 && draft_id < cfg_.draft_vocab, "EAGLE-3: draft id ", draft_id, " out of range");
  return int32_t(draft_id + d2t_[size_t(draft_id)]);
}

void Eagle3Draft::forward(Eagle3Kv& kv, std::span<const int32_t> tokens, std::span<const float> hidden,
                          std::vector<float>* out, std::vector<float>* logits) const {
  const int64_t H = cfg_.hidden, I = cfg_.intermediate, D = cfg_.head_dim, Hq = cfg_.heads,
                Hkv = cfg_.kv_heads;
  const int64_t T = int64_t(tokens.size()), G = Hq / Hkv, Dv = cfg_.draft_vocab;
  KILN_CHECK_EQ(int64_t(hidden.size()), T * H, "EAGLE-3: hidden states must be [T, H]");
  for (int32_t tok : tokens)
    KILN_CHECK(tok >= 0 && tok < cfg_.vocab, "EAGLE-3: token ", tok, " out of range");
  out->assign(size_t(T * H), 0.0f);
  if (logits) logits->assign(size_t(T * Dv), 0.0f);
  const size_t nH = static_cast<size_t>(H), nI = static_cast<size_t>(I), nQ = static_cast<size_t>(Hq * D);
  std::vector<float> x(2 * nH), q(nQ), attn(nQ), h(nH), xn(nH), gate(nI), up(nI), mlp(nH), scores;
  const float scale = 1.0f / std::sqrt(float(D));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = kv.len;  // this row's rotary position and KV entry
    const float* hin = hidden.data() + t * H;
    rms_norm(embed_.data() + int64_t(tokens[size_t(t)]) * H, w_in_, H, cfg_.eps, x.data());
    rms_norm(hin, w_hidden_, H, cfg_.eps, x.data() + H);
    matvec(q_, x.data(), Hq * D, 2 * H, q.data());
    kv.k.resize(size_t((p + 1) * Hkv * D));
    kv.v.resize(size_t((p + 1) * Hkv * D));
    float* k = kv.k.data() + p * Hkv * D;
    matvec(k_, x.data(), Hkv * D, 2 * H, k);
    matvec(v_, x.data(), Hkv * D, 2 * H, kv.v.data() + p * Hkv * D);
    for (int64_t hd = 0; hd < Hq; ++hd) rotate(q.data() + hd * D, D, p, inv_freq_);
    for (int64_t hd = 0; hd < Hkv; ++hd) rotate(k + hd * D, D, p, inv_freq_);
    kv.len = p + 1;
    scores.resize(size_t(p + 1));
    for (int64_t hd = 0; hd < Hq; ++hd) {
      const int64_t g = hd / G;
      const float* qh = q.data() + hd * D;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= p; ++j) {
        const float* kj = kv.k.data() + (j * Hkv + g) * D;
        float s = 0.0f;
        for (int64_t e = 0; e < D; ++e) s += qh[e] * kj[e];
        scores[size_t(j)] = s * scale;
        mx = std::max(mx, scores[size_t(j)]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j <= p; ++j) sum += (scores[size_t(j)] = std::exp(scores[size_t(j)] - mx));
      float* o = attn.data() + hd * D;
      std::fill(o, o + D, 0.0f);
      for (int64_t j = 0; j <= p; ++j) {
        const float* vj = kv.v.data() + (j * Hkv + g) * D;
        for (int64_t e = 0; e < D; ++e) o[e] += scores[size_t(j)] * vj[e];
      }
      for (int64_t e = 0; e < D; ++e) o[e] /= sum;
    }
    matvec(o_, attn.data(), H, Hq * D, h.data());
    for (int64_t i = 0; i < H; ++i) h[size_t(i)] += hin[i];
    rms_norm(h.data(), w_post_, H, cfg_.eps, xn.data());
    matvec(gate_, xn.data(), I, H, gate.data());
    matvec(up_, xn.data(), I, H, up.data());
    for (int64_t i = 0; i < I; ++i) {
      const float g = gate[size_t(i)];
      gate[size_t(i)] = g / (1.0f + std::exp(-g)) * up[size_t(i)];
    }
    matvec(down_, gate.data(), H, I, mlp.data());
    float* y = out->data() + t * H;
    for (int64_t i = 0; i < H; ++i) y[i] = h[size_t(i)] + mlp[size_t(i)];
    if (logits) {
      rms_norm(y, w_norm_, H, cfg_.eps, xn.data());
      matvec(lm_head_, xn.data(), Dv, H, logits->data() + t * Dv);
    }
  }
}

std::vector<int32_t> Eagle3Draft::chain(Eagle3Kv& kv, std::span<const float> hidden,
                                        std::span<const float> logits, int32_t k) const {
  const int64_t H = cfg_.hidden, Dv = cfg_.draft_vocab;
  KILN_CHECK(int64_t(hidden.size()) == H && int64_t(logits.size()) == Dv && k >= 0,
             "EAGLE-3 chain: hidden [H] and logits [draft vocab] of the last row, k >= 0");
  std::vector<int32_t> drafts;
  if (k == 0) return drafts;
  drafts.push_back(target_token(argmax(logits.data(), Dv)));
  std::vector<float> h(hidden.begin(), hidden.end()), out, lg;
  for (int32_t s = 1; s < k; ++s) {
    const int32_t tok = drafts.back();
    forward(kv, std::span<const int32_t>(&tok, 1), h, &out, &lg);
    drafts.push_back(target_token(argmax(lg.data(), Dv)));
    h = out;
  }
  return drafts;
}

}  // namespace kiln
