// Issue 41 point 8 on the CPU, without the fixtures the device machine makes: a checkpoint of the reported
// shape (hidden 64, 2 query heads / 1 KV head of head_dim 64 so q_proj is [128, 64], intermediate 128, tied,
// rope_theta 1e6, max_position_embeddings 4096, every matrix N(0, 0.2^2) and every norm weight
// 1 + N(0, 0.1^2), bf16; Qwen3-Embedding's layout with lasttoken pooling and Normalize; the odd vocabulary
// 151,669) written here, and the engine's vectors -- all prompts at once, chunked prefill, the prefix cache
// on
// -- against an fp64 forward of the same weights written in this file with none of kiln's ops (the textbook
// Qwen3: RMSNorm, per-head q/k RMSNorm, NeoX rotary, causal GQA softmax attention scaled by head_dim^-0.5,
// SiLU-gated MLP). The issue measured cosines of 0.07-0.38 between kiln and sentence-transformers on short
// texts of such a model; kiln's bf16 engine must stay within cosine 0.999 of the exact model on short prompts
// and on one of 376 tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/test_support.h"
#include "engine_test_util.h"
#include "kiln/config.h"
#include "kiln/safetensors.h"
#include "model/weights.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace kiln;

namespace {

constexpr int64_t kVocab = 151669, kHidden = 64, kHeads = 2, kKvHeads = 1, kHeadDim = 64, kInter = 128,
                  kLayers = 2;
constexpr int32_t kEndOfText = 151643;  // what Qwen3-Embedding's post-processor appends
constexpr double kTheta = 1e6, kEps = 1e-6;

using Matrix = std::vector<double>;  // row-major

// The checkpoint's tensors as bf16 values (what the engine reads) and as doubles (what the reference reads).
struct Weights {
  RandomWeights bf16;  // random_weights' shapes and names, its values replaced by the draw below
  std::map<std::string, Matrix> f64;
};

Weights draw_weights(const ModelConfig& cfg) {
  const auto specs = qwen3_weight_specs(cfg);
  Weights w{random_weights(specs, 0), {}};
  std::mt19937_64 rng(41);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t t = 0; t < specs.size(); ++t) {
    std::vector<bf16_t>& v = w.bf16.data[t];
    Matrix& f = w.f64[specs[t].name];
    f.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = f32_to_bf16(specs[t].norm ? 1.0f + 0.1f * normal(rng) : 0.2f * normal(rng));
      f[i] = double(bf16_to_f32(v[i]));
    }
  }
  return w;
}

// out[r] = sum_c x[c] w[r * cols + c] for r < rows.
std::vector<double> matvec(const Matrix& w, const std::vector<double>& x, int64_t rows, int64_t cols) {
  std::vector<double> out(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(r)] += w[size_t(r * cols + c)] * x[size_t(c)];
  return out;
}

// x[off, off + n) = x / rms(x) * w.
void rms_norm(std::vector<double>& x, size_t off, size_t n, const Matrix& w) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += x[off + i] * x[off + i];
  const double inv = 1.0 / std::sqrt(s / double(n) + kEps);
  for (size_t i = 0; i < n; ++i) x[off + i] = x[off + i] * inv * w[i];
}

// NeoX rotary on one head [D] at position p.
void rotate(std::vector<double>& v, size_t off, int64_t p) {
  const int64_t half = kHeadDim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double a = double(p) * std::pow(kTheta, -2.0 * double(i) / double(kHeadDim));
    const double x0 = v[off + size_t(i)], x1 = v[off + size_t(i + half)];
    v[off + size_t(i)] = x0 * std::cos(a) - x1 * std::sin(a);
    v[off + size_t(i + half)] = x1 * std::cos(a) + x0 * std::sin(a);
  }
}

// The normalised final hidden state of the last token, in fp64.
std::vector<double> reference_embedding(const Weights& w, const std::vector<int32_t>& ids) {
  const auto at = [&](const std::string& n) -> const Matrix& { return w.f64.at(n); };
  const size_t T = ids.size(), H = size_t(kHidden), D = size_t(kHeadDim);
  std::vector<std::vector<double>> x(T);
  for (size_t t = 0; t < T; ++t)
    x[t].assign(at("embed_tokens.weight").begin() + ptrdiff_t(size_t(ids[t]) * H),
                at("embed_tokens.weight").begin() + ptrdiff_t(size_t(ids[t]) * H + H));
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> h = x[t];
      rms_norm(h, 0, H, at(p + "input_layernorm.weight"));
      q[t] = matvec(at(p + "self_attn.q_proj.weight"), h, kHeads * kHeadDim, kHidden);
      k[t] = matvec(at(p + "self_attn.k_proj.weight"), h, kKvHeads * kHeadDim, kHidden);
      v[t] = matvec(at(p + "self_attn.v_proj.weight"), h, kKvHeads * kHeadDim, kHidden);
      for (int64_t hd = 0; hd < kHeads; ++hd) {
        rms_norm(q[t], size_t(hd) * D, D, at(p + "self_attn.q_norm.weight"));
        rotate(q[t], size_t(hd) * D, int64_t(t));
      }
      for (int64_t hd = 0; hd < kKvHeads; ++hd) {
        rms_norm(k[t], size_t(hd) * D, D, at(p + "self_attn.k_norm.weight"));
        rotate(k[t], size_t(hd) * D, int64_t(t));
      }
    }
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> o(size_t(kHeads) * D, 0.0);
      for (int64_t hd = 0; hd < kHeads; ++hd) {
        const size_t qo = size_t(hd) * D, ko = size_t(hd / (kHeads / kKvHeads)) * D;
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (size_t d = 0; d < D; ++d) dot += q[t][qo + d] * k[j][ko + d];
          s[j] = dot / std::sqrt(double(D));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j <= t; ++j)
          for (size_t d = 0; d < D; ++d) o[qo + d] += s[j] / sum * v[j][ko + d];
      }
      const std::vector<double> a = matvec(at(p + "self_attn.o_proj.weight"), o, kHidden, kHeads * kHeadDim);
      for (size_t i = 0; i < H; ++i) x[t][i] += a[i];
      std::vector<double> h = x[t];
      rms_norm(h, 0, H, at(p + "post_attention_layernorm.weight"));
      const std::vector<double> g = matvec(at(p + "mlp.gate_proj.weight"), h, kInter, kHidden);
      std::vector<double> u = matvec(at(p + "mlp.up_proj.weight"), h, kInter, kHidden);
      for (size_t i = 0; i < u.size(); ++i) u[i] *= g[i] / (1.0 + std::exp(-g[i]));
      const std::vector<double> dn = matvec(at(p + "mlp.down_proj.weight"), u, kHidden, kInter);
      for (size_t i = 0; i < H; ++i) x[t][i] += dn[i];
    }
  }
  std::vector<double> last = x.back();
  rms_norm(last, 0, H, at("norm.weight"));
  double n2 = 0;
  for (double e : last) n2 += e * e;
  for (double& e : last) e /= std::sqrt(n2);
  return last;
}

TEST(EmbeddingReference, PointEightShapeMatchesAnExactForward) {
  const char* config = R"({"architectures": ["Qwen3ForCausalLM"], "head_dim": 64, "hidden_size": 64,
    "intermediate_size": 128, "max_position_embeddings": 4096, "num_attention_heads": 2,
    "num_hidden_layers": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "vocab_size": 151669,
    "bos_token_id": 151643, "eos_token_id": 151643, "dtype": "bfloat16"})";
  const fs::path d = test_support::process_scratch_dir("embedding_reference") / "point8";
  fs::create_directories(d / "1_Pooling");
  std::ofstream(d / "config.json") << config;
  std::ofstream(d / "modules.json") << json::array(
      {{{"idx", 0}, {"path", ""}, {"type", "sentence_transformers.models.Transformer"}},
       {{"idx", 1}, {"path", "1_Pooling"}, {"type", "sentence_transformers.models.Pooling"}},
       {{"idx", 2}, {"path", "2_Normalize"}, {"type", "sentence_transformers.models.Normalize"}}});
  std::ofstream(d / "1_Pooling/config.json")
      << json{{"word_embedding_dimension", kHidden}, {"pooling_mode_lasttoken", true}};
  ModelConfig cfg = parse_model_config(config, "point 8 config");
  cfg.weight_prefix = "";  // Qwen3-Embedding's unprefixed names
  const Weights w = draw_weights(cfg);
  write_safetensors((d / "model.safetensors").string(), w.bf16.tensors);

  // Short prompts (the issue's short texts are 6-27 tokens), two sharing a prefix, and one of 376; each ends
  // in <|endoftext|> as the post-processor makes it.
  std::vector<std::vector<int32_t>> prompts;
  for (int n : {7, 12, 26, 1, 12, 375}) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(int32_t((uint64_t(i) * 2654435761u + uint64_t(n)) % 151643));
    p.push_back(kEndOfText);
    prompts.push_back(p);
  }
  prompts[4] = prompts[2];
  prompts[4].resize(20);
  prompts[4].push_back(kEndOfText);

  EngineOptions o = test::small_opts(4096, /*page_size=*/16, /*chunk=*/64);
  o.model_dir = d.string();
  o.device = "cpu";
  auto engine = Engine::create(o);
  ASSERT_TRUE(engine->is_embedding_model());
  test::Sink sink;
  std::vector<RequestId> ids;
  for (const auto& p : prompts) {
    Request r;
    r.prompt = p;
    r.embedding = true;
    ids.push_back(engine->submit(r, sink.cb()));
  }
  sink.wait_finished(int(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) {
    const TokenEvent e = sink.last(ids[i]);
    ASSERT_EQ(e.finish_reason, "stop") << e.error;
    const std::vector<double> want = reference_embedding(w, prompts[i]);
    ASSERT_EQ(e.embedding.size(), want.size());
    double dot = 0, n2 = 0;
    for (size_t j = 0; j < want.size(); ++j) {
      dot += double(e.embedding[j]) * want[j];
      n2 += double(e.embedding[j]) * double(e.embedding[j]);
    }
    const double c = dot / std::sqrt(n2);
    EXPECT_GE(c, 0.999) << "prompt " << i << " of " << prompts[i].size() << " tokens";
    std::printf("  prompt of %3zu tokens: cosine to the exact forward %.6f\n", prompts[i].size(), c);
  }
}

}  // namespace
