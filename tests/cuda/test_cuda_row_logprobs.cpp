// cuda::row_logprobs against the host reference (runtime/prompt_logprobs.h row_logprobs) over odd shapes and
// tied rows, and prompt log-probabilities / score ids through the engine on a tiny CUDA Qwen3 against a full
// forward of the same model on the same GPU (every row's logits, log-softmax in double on the host).
#include <algorithm>
#include <cmath>

#include "../unit/engine_test_util.h"
#include "common/prompt_logits.h"
#include "model/qwen3.h"
#include "ops/cuda/row_logprobs.h"
#include "runtime/prompt_logprobs.h"
#include "runtime/qwen3_runner.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using test::to_device;
using test::to_host;

TEST(CudaRowLogprobs, EqualTheHostReference) {
  KILN_REQUIRE_GPU();
  std::mt19937 rng(5);
  for (int64_t V : {1, 7, 1000, 151936}) {
    for (int64_t R : {1, 5, 19}) {
      const int n = V == 1 ? 1 : 3;
      std::vector<float> x(size_t(R * V));
      std::normal_distribution<float> d(0.0f, 4.0f);
      for (float& v : x)
        v = std::round(d(rng) * 8.0f) / 8.0f;  // coarse values: many ties, as bf16 logits have
      std::vector<int32_t> ids(size_t(R * n));
      for (auto& id : ids) id = int32_t(rng() % uint32_t(V));
      Buffer dx = to_device(x), di = to_device(ids);
      Buffer dl(size_t(R * n) * 4, Device::cuda()), dr(size_t(R * n) * 4, Device::cuda());
      cuda::row_logprobs(static_cast<float*>(dx.data()), V, R, V, static_cast<int32_t*>(di.data()), n,
                         static_cast<float*>(dl.data()), static_cast<int32_t*>(dr.data()), nullptr);
      const auto lp = to_host<float>(dl, size_t(R * n));
      const auto rk = to_host<int32_t>(dr, size_t(R * n));
      for (int64_t r = 0; r < R; ++r) {
        const std::vector<int32_t> want_ids(ids.begin() + r * n, ids.begin() + (r + 1) * n);
        const RowLogprobs want =
            row_logprobs(std::span<const float>(x.data() + r * V, size_t(V)), want_ids, 0);
        for (int j = 0; j < n; ++j) {
          EXPECT_NEAR(lp[size_t(r * n + j)], want.logprobs[size_t(j)],
                      1e-5 * (1 + std::fabs(want.logprobs[size_t(j)])))
              << "V " << V << " row " << r;
          EXPECT_EQ(rk[size_t(r * n + j)], want.ranks[size_t(j)]) << "V " << V << " row " << r;
        }
      }
    }
  }
}

const char* kTinyConfig = R"({
  "architectures": ["Qwen3ForCausalLM"], "dtype": "bfloat16", "eos_token_id": 2, "head_dim": 64,
  "hidden_act": "silu", "hidden_size": 256, "intermediate_size": 512, "max_position_embeddings": 4096,
  "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": false, "vocab_size": 5003})";

std::unique_ptr<Qwen3Model> tiny_cuda_model() {
  LoadOptions lo;
  lo.seed = 11;
  lo.device = Device::cuda();
  return Qwen3Model::create(parse_model_config(kTinyConfig, "tiny"), nullptr, lo);
}

// Prompt logprobs from the engine on the GPU (chunks of 16 rows, device reduction) against one full forward.
TEST(CudaPromptLogprobs, EngineEqualsAFullForward) {
  KILN_REQUIRE_GPU();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(int32_t((i * 7919 + 13) % 5003));
  auto m = tiny_cuda_model();
  const int64_t V = 5003, n = int64_t(prompt.size());
  const int ps = 16;
  const std::vector<float> all = test::every_row_logits(*m, prompt, ps);
  EngineOptions o = test::small_opts(4096, ps, 64);  // 150 rows in three steps, 64-row groups
  Engine engine(std::make_unique<Qwen3Runner>(tiny_cuda_model(), ops::KvLayout::nhd, DType::bf16), o);
  test::Sink sink;
  Request r = test::greedy(prompt, 1);
  r.prompt_logprobs_from = 0;
  r.prompt_top_logprobs = 2;
  const RequestId id = engine.submit(r, sink.cb());
  Request s = test::greedy(prompt, 0);
  s.score_ids = {17, 4000};
  const RequestId sid = engine.submit(s, sink.cb());
  sink.wait_finished(2);
  std::lock_guard<std::mutex> lk(sink.mu);
  const auto& got = sink.events[id].front().prompt_logprobs;
  ASSERT_EQ(int64_t(got.size()), n - 1);
  auto lsm = [&](int64_t row, int32_t tok) {
    return test_support::log_softmax(all.data() + row * V, V)[size_t(tok)];
  };
  // Chunked prefill and a different LM-head row count may move a bf16 logit by an ulp: 0.05 bounds that.
  for (int64_t p = 1; p < n; ++p) {
    const PromptTokenLogprob& g = got[size_t(p - 1)];
    EXPECT_EQ(g.position, p);
    EXPECT_NEAR(g.logprob, lsm(p - 1, prompt[size_t(p)]), 0.05) << p;
    ASSERT_EQ(g.top.size(), 2u);
    EXPECT_NEAR(g.top[0].logprob, lsm(p - 1, g.top[0].id), 0.05) << p;
    EXPECT_GE(g.top[0].logprob, g.top[1].logprob);
    EXPECT_GE(g.rank, 1);
  }
  const auto& sc = sink.events[sid].back().score_logprobs;
  ASSERT_EQ(sc.size(), 2u);
  EXPECT_NEAR(sc[0], lsm(n - 1, 17), 0.05);
  EXPECT_NEAR(sc[1], lsm(n - 1, 4000), 0.05);
}

}  // namespace
}  // namespace kiln
