// The decode CUDA graph: replayed steps equal eager steps bit for bit while every input changes between
// replays (token, position, slot, context length, a page-table entry appearing at a page boundary), with
// and without programmatic dependent launch; a workspace reallocation forces a recapture.
#include "model/cuda_graph.h"
#include "ops/cuda/context.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.intermediate_size = 384;
  c.num_layers = 2;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 256;
  c.tie_word_embeddings = true;
  return c;
}

BatchDesc step_batch(int32_t pos, int32_t token, int32_t ps) {
  BatchDesc b;
  b.page_size = ps;
  b.tokens = {token};
  b.positions = {pos};
  // Pages in reverse order so a page-table change shows: page of position p is 15 - p / ps.
  b.slot_mapping = {int64_t(15 - pos / ps) * ps + pos % ps};
  b.cu_q = {0, 1};
  b.kv_lens = {pos + 1};
  b.pages_stride = pos / ps + 1;
  for (int32_t i = 0; i <= pos / ps; ++i) b.page_table.push_back(15 - i);
  b.logit_rows = {0};
  return b;
}

std::vector<float> host(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  copy_bytes(v.data(), Device::cpu(), t.data, t.device, v.size() * 4);
  return v;
}

void run_case(bool pdl) {
  LoadOptions o;
  o.device = Device::cuda();
  o.seed = 3;
  auto m = Qwen3Model::create(tiny_config(), nullptr, o);
  const int ps = 16;
  KvCache eager_cache(m->config(), 16, ps, ops::KvLayout::hnd, DType::bf16, Device::cuda());
  KvCache graph_cache(m->config(), 16, ps, ops::KvLayout::hnd, DType::bf16, Device::cuda());
  Buffer dl(512 * 4, Device::cuda());
  const Tensor eager_logits(dl.data(), DType::f32, {1, 512}, Device::cuda());
  cuda::set_pdl(pdl);
  CudaDecodeGraph g(*m, graph_cache, 16);
  for (int32_t pos = 0; pos < 40; ++pos) {  // crosses the page boundaries at 16 and 32
    const BatchDesc b = step_batch(pos, (pos * 97 + 5) % 512, ps);
    m->forward(b, eager_cache, eager_logits);
    const auto want = host(eager_logits);
    const auto got = host(g.step(b));
    ASSERT_EQ(got, want) << "step " << pos << " pdl " << pdl;
  }
  EXPECT_EQ(g.captures(), 1) << "inputs changing must not force a recapture";
  // A larger step reallocates the workspace: the next replay recaptures and stays exact.
  BatchDesc big;
  big.page_size = ps;
  for (int32_t i = 0; i < 64; ++i) {
    big.tokens.push_back(i), big.positions.push_back(i), big.slot_mapping.push_back(int64_t(8) * ps + i);
  }
  big.cu_q = {0, 64}, big.kv_lens = {64}, big.pages_stride = 4, big.page_table = {8, 9, 10, 11};
  big.logit_rows = {63};
  KvCache scratch_cache(m->config(), 16, ps, ops::KvLayout::hnd, DType::bf16, Device::cuda());
  m->forward(big, scratch_cache, eager_logits);
  const BatchDesc b = step_batch(40, 7, ps);
  m->forward(b, eager_cache, eager_logits);
  const auto want = host(eager_logits);
  EXPECT_EQ(host(g.step(b)), want);
  EXPECT_EQ(g.captures(), 2);
  cuda::set_pdl(false);
}

TEST(CudaGraph, ReplayEqualsEagerWhileInputsChange) {
  KILN_REQUIRE_GPU();
  run_case(false);
}

TEST(CudaGraph, ReplayEqualsEagerWithPdl) {
  KILN_REQUIRE_GPU();
  run_case(true);
}

}  // namespace
}  // namespace kiln
