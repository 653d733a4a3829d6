// Qwen3Model on the CPU backend: batching invariance (a mixed prefill + decode step equals running each
// sequence alone, bit for bit), chunked prefill, layouts and page sizes, checkpoint loading, bad input.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <vector>

#include "kiln/safetensors.h"
#include "model/qwen3.h"
#include "tiny_model_config.h"

using namespace kiln;

namespace {

ModelConfig tiny_config(bool tied = true) {
  return test::tiny_cpu_config(tied);
}

// One sequence's state across steps: its pages and how many tokens the cache holds.
struct Seq {
  std::vector<int32_t> tokens;  // whole sequence
  std::vector<int32_t> pages;
  int32_t cached = 0;
};

// Appends `n` new tokens of `s` to the batch (allocating pages from `next_page`).
void add_seq(BatchDesc& b, Seq& s, int32_t n, int32_t& next_page, bool want_logits) {
  const int32_t ps = b.page_size;
  while (int32_t(s.pages.size()) * ps < s.cached + n) s.pages.push_back(next_page++);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t p = s.cached + i;
    b.tokens.push_back(s.tokens[size_t(p)]);
    b.positions.push_back(p);
    b.slot_mapping.push_back(int64_t(s.pages[size_t(p / ps)]) * ps + p % ps);
  }
  if (b.cu_q.empty()) b.cu_q.push_back(0);
  b.cu_q.push_back(b.cu_q.back() + n);
  b.kv_lens.push_back(s.cached + n);
  if (want_logits) b.logit_rows.push_back(b.cu_q.back() - 1);
  s.cached += n;
}

// Builds the page table once all sequences are added (stride = the longest page list).
void finish(BatchDesc& b, const std::vector<Seq*>& seqs) {
  int32_t stride = 1;
  for (Seq* s : seqs) stride = std::max(stride, int32_t(s->pages.size()));
  b.pages_stride = stride;
  b.page_table.assign(seqs.size() * size_t(stride), 0);
  for (size_t i = 0; i < seqs.size(); ++i)
    for (size_t j = 0; j < seqs[i]->pages.size(); ++j)
      b.page_table[i * size_t(stride) + j] = seqs[i]->pages[j];
}

std::vector<float> run(Qwen3Model& m, KvCache& cache, const BatchDesc& b) {
  std::vector<float> logits(b.logit_rows.size() * size_t(m.config().vocab_size));
  m.forward(b, cache,
            Tensor(logits.data(), DType::f32, {int64_t(b.logit_rows.size()), m.config().vocab_size}));
  return logits;
}

std::vector<int32_t> seq_tokens(int n, int seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = (seed * 37 + i * 101) % 301;
  return t;
}

// A contiguous bf16 view with a runtime shape.
Tensor shaped(void* p, const std::vector<int64_t>& shape) {
  Tensor t(p, DType::bf16, {1});
  t.ndim = int(shape.size());
  int64_t st = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.shape[size_t(i)] = shape[size_t(i)];
    t.stride[size_t(i)] = st;
    st *= shape[size_t(i)];
  }
  return t;
}

std::unique_ptr<Qwen3Model> tiny_model(bool tied = true) {
  LoadOptions o;
  o.seed = 7;
  return Qwen3Model::create(tiny_config(tied), nullptr, o);
}

}  // namespace

TEST(Qwen3Model, MixedBatchEqualsSequencesAlone) {
  auto m = tiny_model();
  const int64_t V = m->config().vocab_size;
  for (auto layout : {ops::KvLayout::nhd, ops::KvLayout::hnd}) {
    for (int ps : {1, 16}) {
      // Alone: A (7-token prefill), B (5-token prefill), C (4-token prefill, then one decode token).
      std::vector<std::vector<float>> alone;
      for (int which = 0; which < 3; ++which) {
        KvCache cache(m->config(), 64, ps, layout, DType::bf16, Device::cpu());
        int32_t next = 1;
        Seq s{seq_tokens(which == 0 ? 7 : which == 1 ? 5 : 5, which), {}, 0};
        BatchDesc b;
        b.page_size = ps;
        add_seq(b, s, which == 2 ? 4 : int32_t(s.tokens.size()), next, true);
        finish(b, {&s});
        auto l = run(*m, cache, b);
        if (which == 2) {
          BatchDesc d;
          d.page_size = ps;
          add_seq(d, s, 1, next, true);
          finish(d, {&s});
          l = run(*m, cache, d);
        }
        alone.push_back(l);
      }
      // Mixed: C's prefix first, then one step with A and B prefilling and C decoding.
      KvCache cache(m->config(), 64, ps, layout, DType::bf16, Device::cpu());
      int32_t next = 1;
      Seq a{seq_tokens(7, 0), {}, 0}, b{seq_tokens(5, 1), {}, 0}, c{seq_tokens(5, 2), {}, 0};
      BatchDesc pre;
      pre.page_size = ps;
      add_seq(pre, c, 4, next, false);
      finish(pre, {&c});
      run(*m, cache, pre);
      BatchDesc mixed;
      mixed.page_size = ps;
      add_seq(mixed, a, 7, next, true);
      add_seq(mixed, b, 5, next, true);
      add_seq(mixed, c, 1, next, true);
      finish(mixed, {&a, &b, &c});
      const auto l = run(*m, cache, mixed);
      for (int r = 0; r < 3; ++r) {
        for (int64_t v = 0; v < V; ++v) {
          ASSERT_EQ(l[size_t(r * V + v)], alone[size_t(r)][size_t(v)])
              << "row " << r << " vocab " << v << " page " << ps << " layout " << int(layout);
        }
      }
      for (float x : l) ASSERT_TRUE(std::isfinite(x));
    }
  }
}

TEST(Qwen3Model, ChunkedPrefillAndLayoutsAgree) {
  auto m = tiny_model(false);
  std::vector<float> first;
  for (auto layout : {ops::KvLayout::nhd, ops::KvLayout::hnd}) {
    for (int ps : {1, 16, 32}) {
      for (int chunk : {13, 6, 1}) {
        KvCache cache(m->config(), 64, ps, layout, DType::bf16, Device::cpu());
        int32_t next = 0;
        Seq s{seq_tokens(13, 5), {}, 0};
        std::vector<float> l;
        while (s.cached < 13) {
          BatchDesc b;
          b.page_size = ps;
          const int32_t n = std::min<int32_t>(chunk, 13 - s.cached);
          add_seq(b, s, n, next, s.cached + n == 13);
          finish(b, {&s});
          l = run(*m, cache, b);
        }
        if (first.empty()) {
          first = l;
        } else {
          ASSERT_EQ(l, first) << "layout " << int(layout) << " page " << ps << " chunk " << chunk;
        }
      }
    }
  }
}

TEST(Qwen3Model, ForwardHiddenGivesFinalNormRows) {
  auto m = tiny_model();
  KvCache cache(m->config(), 8, 16, ops::KvLayout::nhd, DType::bf16, Device::cpu());
  Seq s{seq_tokens(9, 3), {}, 0};
  int32_t next = 0;
  BatchDesc b;
  b.page_size = 16;
  add_seq(b, s, 9, next, true);
  b.logit_rows = {2, 8};
  finish(b, {&s});
  const int64_t H = m->config().hidden_size, V = m->config().vocab_size;
  std::vector<bf16_t> hidden(2 * size_t(H));
  m->forward_hidden(b, cache, Tensor(hidden.data(), DType::bf16, {2, H}));
  // The LM head over these rows gives the forward's logits (the logits are those rows times E^T).
  KvCache cache2(m->config(), 8, 16, ops::KvLayout::nhd, DType::bf16, Device::cpu());
  const auto logits = run(*m, cache2, b);
  const Tensor& E = m->weights().lm_head;
  for (int r = 0; r < 2; ++r) {
    double norm2 = 0;
    for (int64_t i = 0; i < H; ++i)
      norm2 += double(bf16_to_f32(hidden[size_t(r * H + i)])) * bf16_to_f32(hidden[size_t(r * H + i)]);
    EXPECT_GT(norm2, 0.1 * double(H));  // RMS-normalised with weights near 1
    for (int64_t v = 0; v < V; v += 37) {
      double dot = 0;
      for (int64_t i = 0; i < H; ++i)
        dot += double(bf16_to_f32(hidden[size_t(r * H + i)])) * bf16_to_f32(E.ptr<bf16_t>()[v * H + i]);
      EXPECT_NEAR(logits[size_t(r * V + v)], dot, 1e-2 + std::abs(dot) * 1e-2) << r << "," << v;
    }
  }
}

TEST(Qwen3Model, Fp8CacheRunsAndStaysClose) {
  auto m = tiny_model();
  const int64_t V = m->config().vocab_size;
  std::vector<std::vector<float>> out;
  for (DType dt : {DType::bf16, DType::f8e4m3}) {
    KvCache cache(m->config(), 8, 16, ops::KvLayout::hnd, dt, Device::cpu());
    Seq s{seq_tokens(11, 4), {}, 0};
    int32_t next = 0;
    BatchDesc b;
    b.page_size = 16;
    add_seq(b, s, 11, next, true);
    finish(b, {&s});
    out.push_back(run(*m, cache, b));
  }
  double num = 0, den = 0;
  for (int64_t v = 0; v < V; ++v) {
    num += (out[0][size_t(v)] - out[1][size_t(v)]) * (out[0][size_t(v)] - out[1][size_t(v)]);
    den += out[0][size_t(v)] * out[0][size_t(v)];
  }
  EXPECT_GT(num, 0.0);                   // the fp8 cache really quantises
  EXPECT_LT(std::sqrt(num / den), 0.1);  // but stays close
}

TEST(Qwen3Model, LoadsCheckpointAndRejectsBadOnes) {
  const ModelConfig cfg = tiny_config(false);
  const auto dir = std::filesystem::temp_directory_path() / ("kiln_test_model_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::vector<bf16_t>> data;
  std::vector<NamedTensor> named;
  for (const WeightSpec& s : qwen3_weight_specs(cfg)) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    data.emplace_back(size_t(n));
    fill_random_weight(s, 7, data.back().data());
    named.push_back({s.name, shaped(data.back().data(), s.shape)});
  }
  write_safetensors((dir / "model.safetensors").string(), named);
  const Checkpoint ck = Checkpoint::open(dir.string());
  LoadOptions o;
  o.seed = 7;
  auto from_file = Qwen3Model::create(cfg, &ck, o);
  auto random = Qwen3Model::create(cfg, nullptr, o);
  Seq s1{seq_tokens(6, 9), {}, 0}, s2 = s1;
  int32_t n1 = 0, n2 = 0;
  BatchDesc b1, b2;
  b1.page_size = b2.page_size = 16;
  add_seq(b1, s1, 6, n1, true);
  add_seq(b2, s2, 6, n2, true);
  finish(b1, {&s1});
  finish(b2, {&s2});
  KvCache c1(cfg, 4, 16, ops::KvLayout::nhd, DType::bf16, Device::cpu());
  KvCache c2(cfg, 4, 16, ops::KvLayout::nhd, DType::bf16, Device::cpu());
  EXPECT_EQ(run(*from_file, c1, b1), run(*random, c2, b2));

  // A tensor with the wrong dtype, and a missing tensor: clear errors naming it.
  std::vector<float> f32(static_cast<size_t>(cfg.hidden_size), 1.0f);
  for (auto& nt : named) {
    if (nt.name == "model.norm.weight") nt.tensor = Tensor(f32.data(), DType::f32, {cfg.hidden_size});
  }
  write_safetensors((dir / "model.safetensors").string(), named);
  try {
    const Checkpoint bad = Checkpoint::open(dir.string());
    Qwen3Model::create(cfg, &bad, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.norm.weight"), std::string::npos) << e.what();
  }
  named.pop_back();  // lm_head.weight
  write_safetensors((dir / "model.safetensors").string(), named);
  {
    const Checkpoint bad = Checkpoint::open(dir.string());
    EXPECT_THROW(Qwen3Model::create(cfg, &bad, o), Error);
  }
  std::filesystem::remove_all(dir);
}

TEST(Qwen3Model, RejectsBadBatches) {
  auto m = tiny_model();
  KvCache cache(m->config(), 4, 16, ops::KvLayout::nhd, DType::bf16, Device::cpu());
  auto make = [&] {
    Seq s{seq_tokens(3, 1), {}, 0};
    int32_t next = 0;
    BatchDesc b;
    b.page_size = 16;
    add_seq(b, s, 3, next, true);
    finish(b, {&s});
    return b;
  };
  std::vector<float> logits(size_t(m->config().vocab_size));
  const Tensor lt(logits.data(), DType::f32, {1, m->config().vocab_size});
  BatchDesc b = make();
  b.tokens[1] = 301;  // out of vocab
  EXPECT_THROW(m->forward(b, cache, lt), Error);
  b = make();
  b.positions[2] = 128;  // past the rotary table
  EXPECT_THROW(m->forward(b, cache, lt), Error);
  b = make();
  b.page_size = 32;  // not the cache's
  EXPECT_THROW(m->forward(b, cache, lt), Error);
  b = make();
  EXPECT_THROW(m->forward(b, cache, Tensor(logits.data(), DType::f32, {1, 300})), Error);
  b = make();
  m->forward(b, cache, lt);  // and a good one still works afterwards
  for (float x : logits) EXPECT_TRUE(std::isfinite(x));
}

TEST(Qwen3Model, UntiedEmbeddingModelHasNoLmHead) {
  ModelConfig cfg = tiny_config(false);
  cfg.arch = ModelArch::qwen3_embedding;
  cfg.architecture = "Qwen3Model";
  cfg.weight_prefix = "";
  for (const WeightSpec& s : qwen3_weight_specs(cfg)) EXPECT_NE(s.name, "lm_head.weight");
  EXPECT_EQ(qwen3_weight_specs(cfg).front().name, "embed_tokens.weight");
  LoadOptions o;
  auto m = Qwen3Model::create(cfg, nullptr, o);
  KvCache cache(cfg, 4, 16, ops::KvLayout::nhd, DType::bf16, Device::cpu());
  Seq s{seq_tokens(5, 2), {}, 0};
  int32_t next = 0;
  BatchDesc b;
  b.page_size = 16;
  add_seq(b, s, 5, next, true);
  finish(b, {&s});
  std::vector<float> hidden(static_cast<size_t>(cfg.hidden_size));
  m->forward_hidden(b, cache, Tensor(hidden.data(), DType::f32, {1, cfg.hidden_size}));
  double n2 = 0;
  for (float x : hidden) n2 += double(x) * x;
  EXPECT_GT(n2, 0.1 * double(cfg.hidden_size));
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  EXPECT_THROW(m->forward(b, cache, Tensor(logits.data(), DType::f32, {1, cfg.vocab_size})), Error);
}

// Issue 41 point 7: an embedding model holds no LM head, whatever the checkpoint: tied (the hub's
// Qwen3-Embedding: lm_head used to alias the embedding table, so a CUDA start tuned a vocabulary GEMM) or an
// untied generation checkpoint that carries lm_head.weight, served with --is-embedding (force_embedding).
TEST(Qwen3Model, EmbeddingModelWeightsHoldNoLmHead) {
  const ModelConfig untied = tiny_config(false);
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kiln_test_model_embedding_head_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const RandomWeights rw = random_weights(qwen3_weight_specs(untied), 11);
  bool has_head = false;
  for (const NamedTensor& t : rw.tensors) has_head |= t.name == "lm_head.weight";
  ASSERT_TRUE(has_head);
  write_safetensors((dir / "model.safetensors").string(), rw.tensors);
  const Checkpoint ck = Checkpoint::open(dir.string());
  for (bool tied : {true, false}) {
    ModelConfig cfg = tiny_config(tied);
    LoadOptions o;
    o.seed = 11;
    auto lm = Qwen3Model::create(cfg, tied ? nullptr : &ck, o);
    EXPECT_NE(lm->weights().lm_head.data, nullptr) << "tied " << tied;  // a generation model keeps its head
    force_embedding(cfg);
    ASSERT_EQ(cfg.arch, ModelArch::qwen3_embedding);
    auto m = Qwen3Model::create(cfg, tied ? nullptr : &ck, o);
    EXPECT_EQ(m->weights().lm_head.data, nullptr) << "tied " << tied;
    for (const WeightSpec& s : qwen3_weight_specs(cfg)) EXPECT_NE(s.name, "lm_head.weight");
    // The hidden states are the generation model's: the same layers, only the head is gone.
    KvCache c1(cfg, 4, 16, ops::KvLayout::nhd, DType::bf16, Device::cpu());
    KvCache c2(cfg, 4, 16, ops::KvLayout::nhd, DType::bf16, Device::cpu());
    Seq s1{seq_tokens(5, 3), {}, 0}, s2 = s1;
    int32_t n1 = 0, n2 = 0;
    BatchDesc b1, b2;
    b1.page_size = b2.page_size = 16;
    add_seq(b1, s1, 5, n1, true);
    finish(b1, {&s1});
    add_seq(b2, s2, 5, n2, true);
    finish(b2, {&s2});
    std::vector<float> h1(size_t(cfg.hidden_size)), h2(size_t(cfg.hidden_size));
    lm->forward_hidden(b1, c1, Tensor(h1.data(), DType::f32, {1, cfg.hidden_size}));
    m->forward_hidden(b2, c2, Tensor(h2.data(), DType::f32, {1, cfg.hidden_size}));
    EXPECT_EQ(h1, h2) << "tied " << tied;
    std::vector<float> logits(size_t(cfg.vocab_size));
    EXPECT_THROW(m->forward(b2, c2, Tensor(logits.data(), DType::f32, {1, cfg.vocab_size})), Error);
  }
  std::filesystem::remove_all(dir);
}
