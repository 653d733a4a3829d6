// Qwen3-MoE on CUDA through the whole model: the four transformers-made fixtures
// (tests/fixtures/hf/qwen3_moe_*, hub and fused expert layouts) by `kiln generate --device cuda` within
// HfParityMoe's bounds (common/hf_parity.h: greedy path and log-prob drift against transformers); and the
// decode CUDA graph of a MoE model replayed while tokens, positions and so the routing change, bitwise the
// eager steps, with and without PDL, at batch 1 (the gather GEMV) and at an 80-row bucket (the grouped GEMM,
// three routing chunks); and the engine
// (chunked prefill, mixed batches, the prefix cache, graph buckets) on a MoE checkpoint giving the greedy
// outputs of eager decode steps.
#include <filesystem>
#include <fstream>

#include "common/hf_parity.h"
#include "common/test_support.h"
#include "kiln/safetensors.h"
#include "model/cuda_graph.h"
#include "model/weights.h"
#include "test_util_cuda.h"
#include "tiny_qwen3_config.h"
#include "unit/engine_test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

void check_fixture(const std::string& name) {
  const fs::path dir = fs::path(KILN_SOURCE_DIR) / "tests/fixtures/hf" / name;
  ASSERT_TRUE(fs::exists(dir / "hf_reference.json")) << "missing fixture " << dir;
  test_support::check_hf_fixture_cli(dir, 3, {}, "cuda");
}

TEST(CudaModelMoeHf, NormTopkGqa4Tied) {
  KILN_REQUIRE_GPU();
  check_fixture("qwen3_moe_norm_gqa4_tied");
}
TEST(CudaModelMoeHf, NoNormMlpOnlyLayerGqa2Untied) {
  KILN_REQUIRE_GPU();
  check_fixture("qwen3_moe_nonorm_gqa2_untied");
}
TEST(CudaModelMoeHf, SparseStep2Gqa3Untied) {
  KILN_REQUIRE_GPU();
  check_fixture("qwen3_moe_step2_gqa3_untied");
}
TEST(CudaModelMoeHf, FusedExpertLayout) {
  KILN_REQUIRE_GPU();
  check_fixture("qwen3_moe_norm_gqa4_tied_fused");
}

ModelConfig tiny_moe_config() {
  ModelConfig c = test::tiny_graph_config();
  c.architecture = "Qwen3MoeForCausalLM";
  c.arch = ModelArch::qwen3_moe;
  c.num_layers = 3;
  c.moe.num_experts = 16;
  c.moe.num_experts_per_tok = 4;
  c.moe.moe_intermediate_size = 96;
  c.moe.norm_topk_prob = true;
  c.moe.mlp_only_layers = {1};  // a dense layer between two sparse ones
  return c;
}

// Step t of B sequences decoding: every sequence at position t (so every cached position was written by an
// earlier step), its own token, on its own pages 1 + 4 i .. 4 + 4 i (page size 16).
BatchDesc decode_step(int32_t t, int32_t B) {
  BatchDesc b;
  b.page_size = 16;
  b.cu_q = {0};
  b.pages_stride = 4;
  for (int32_t i = 0; i < B; ++i) {
    b.tokens.push_back((t * 131 + i * 17 + 5) % 512);
    b.positions.push_back(t);
    b.slot_mapping.push_back(int64_t(1 + 4 * i + t / 16) * 16 + t % 16);
    b.cu_q.push_back(i + 1);
    b.kv_lens.push_back(t + 1);
    b.logit_rows.push_back(i);
    for (int32_t p = 0; p < 4; ++p) b.page_table.push_back(1 + 4 * i + p);
  }
  return b;
}

std::vector<float> host(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  copy_bytes(v.data(), Device::cpu(), t.data, t.device, v.size() * 4);
  return v;
}

void run_graph_case(int32_t B, bool pdl) {
  LoadOptions o;
  o.device = Device::cuda();
  o.seed = 21;
  auto m = Qwen3Model::create(tiny_moe_config(), nullptr, o);
  const int64_t pages = 4 * B + 2;
  KvCache eager_cache(m->config(), pages, 16, ops::KvLayout::hnd, DType::bf16, Device::cuda());
  KvCache graph_cache(m->config(), pages, 16, ops::KvLayout::hnd, DType::bf16, Device::cuda());
  Buffer dl(size_t(B) * 512 * 4, Device::cuda());
  const Tensor eager_logits(dl.data(), DType::f32, {B, 512}, Device::cuda());
  CudaDecodeGraph g(*m, graph_cache, 4, B, {}, pdl);
  for (int32_t t = 0; t < 24; ++t) {  // crosses the page boundary at 16
    const BatchDesc b = decode_step(t, B);
    m->forward(b, eager_cache, eager_logits);
    const auto want = host(eager_logits);
    ASSERT_EQ(host(g.step(b)), want) << "batch " << B << " step " << t << " pdl " << pdl;
  }
  EXPECT_EQ(g.captures(), 1) << "inputs changing must not force a recapture";
}

TEST(CudaModelMoe, GraphReplayEqualsEagerBatch1) {
  KILN_REQUIRE_GPU();
  run_graph_case(1, false);
  run_graph_case(1, true);
}

// 80 rows: past the gather GEMV's 64 (the grouped GEMM) and past one 32-token routing chunk.
TEST(CudaModelMoe, GraphReplayEqualsEagerBatch80) {
  KILN_REQUIRE_GPU();
  run_graph_case(80, false);
  run_graph_case(80, true);
}

// A Qwen3-MoE checkpoint of random weights (16 experts, top-4, layer 1 dense) with the Qwen3 vocabulary.
std::string write_moe_checkpoint() {
  const char* config = R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "dtype": "bfloat16",
    "bos_token_id": 151643, "eos_token_id": [151645, 151643], "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 16,
    "num_experts_per_tok": 4, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [1],
    "max_position_embeddings": 40960, "num_attention_heads": 8, "num_hidden_layers": 3,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true,
    "vocab_size": 151936})";
  const fs::path dir = test_support::process_scratch_dir("cuda_model_moe") / "ckpt";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config;
  const ModelConfig cfg = parse_model_config(config, "moe test config");
  const RandomWeights w = random_weights(qwen3_weight_specs(cfg), 3);
  write_safetensors((dir / "model.safetensors").string(), w.tensors, {{"format", "pt"}});
  return dir.string();
}

std::vector<std::vector<int32_t>> run_engine(const EngineOptions& o,
                                             const std::vector<std::vector<int32_t>>& prompts) {
  auto engine = Engine::create(o);
  test::Sink sink;
  std::vector<RequestId> ids;
  for (const auto& p : prompts) {
    Request r = test::greedy(p, 12);
    r.sampling.ignore_eos = true;
    ids.push_back(engine->submit(r, sink.cb()));
  }
  sink.wait_finished(int(prompts.size()));
  std::vector<std::vector<int32_t>> out;
  for (RequestId id : ids) out.push_back(sink.tokens(id));
  test::expect_pool_clean(*engine);
  return out;
}

// Decode batches of at most 7 rows (graph bucket 8): the gather GEMV either way, each row's result its own.
TEST(CudaModelMoe, EngineGraphBucketsEqualEagerSteps) {
  KILN_REQUIRE_GPU();
  EngineOptions graphs;
  graphs.model_dir = write_moe_checkpoint();
  graphs.device = "cuda";
  graphs.page_size = 16;
  graphs.max_total_tokens = 4096;
  std::vector<std::vector<int32_t>> prompts;
  uint32_t rng = 11;
  for (int n : {5, 17, 33, 48, 3, 31}) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(int32_t((rng = rng * 1664525u + 1013904223u) >> 8) % 151000);
    prompts.push_back(p);
  }
  prompts.push_back(prompts[3]);  // served from the prefix cache
  prompts.back().push_back(42);
  EngineOptions eager = graphs;
  eager.disable_cuda_graph = true;
  const auto want = run_engine(eager, prompts);
  EXPECT_EQ(run_engine(graphs, prompts), want) << "CUDA graph buckets change greedy outputs of a MoE model";
  for (const auto& t : want) EXPECT_EQ(t.size(), 12u);
}

}  // namespace
}  // namespace kiln
