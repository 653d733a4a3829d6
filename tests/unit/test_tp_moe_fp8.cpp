// Tensor and expert parallelism of block-FP8 Qwen3-MoE experts on the CPU communicator (ranks as threads,
// runtime/tp_runner.h), as Qwen3-30B-A3B-FP8 ships them (each expert projection F8_E4M3 with its
// weight_scale_inv): each expert's intermediate split on its 128-row block grid, or whole experts per rank,
// against TP = 1 within docs/TENSOR_PARALLEL.md's bound (2 bf16 ulps of the row's largest |logit|: a rank's
// W8A8 partial sums TP = 1's products over whole 128-column blocks in another order, ops/moe.h). A split that
// would cut a block is refused naming moe_intermediate_size, the block and --tp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/fp8_checkpoints.h"
#include "common/test_support.h"
#include "model/fp8_weights.h"
#include "model/weights.h"
#include "runtime/qwen3_runner.h"
#include "runtime/tp_runner.h"

namespace kiln {
namespace {

// The checkpoint (common/fp8_checkpoints.h): hidden 128, moe_intermediate 256 (two 128-row blocks: TP 2
// splits on the grid, TP 4 would not), 4 experts top-2, layer 0 dense, only the experts block-FP8.
std::string fp8_moe_checkpoint() {
  return test::write_fp8_expert_moe_checkpoint("tp_moe_fp8").string();
}

EngineOptions cpu_opts(const std::string& dir) {
  EngineOptions o;
  o.model_dir = dir;
  o.device = "cpu";
  return o;
}

double bf16_ulp(double x) {
  const double a = std::fabs(x);
  return a < 1e-30 ? 0 : std::ldexp(1.0, int(std::floor(std::log2(a))) - 7);
}

// The logits of every position of one prefill (pages from 1 on).
std::vector<float> prefill_logits(ModelRunner& m, const std::vector<int32_t>& prompt) {
  constexpr int32_t kPage = 4;
  const int32_t n = int32_t(prompt.size()), pages = (n + kPage - 1) / kPage;
  m.allocate_kv(pages + 2, kPage);
  BatchDesc b;
  b.page_size = kPage;
  for (int32_t i = 0; i < n; ++i) {
    b.tokens.push_back(prompt[size_t(i)]);
    b.positions.push_back(i);
    b.slot_mapping.push_back(int64_t(kPage) + i);
    b.logit_rows.push_back(i);
  }
  b.cu_q = {0, n};
  b.kv_lens = {n};
  b.pages_stride = pages;
  for (int32_t i = 0; i < pages; ++i) b.page_table.push_back(1 + i);
  std::vector<float> logits;
  m.forward(b, &logits, nullptr);
  return logits;
}

struct Case {
  int tp;
  bool ep;
};

class TpMoeFp8 : public ::testing::TestWithParam<Case> {};

TEST_P(TpMoeFp8, EqualsTp1WithinTheBound) {
  const Case c = GetParam();
  const std::string dir = fp8_moe_checkpoint();
  auto full = load_qwen3_runner(cpu_opts(dir));
  ASSERT_TRUE(full->model().weights().layers[1].moe.is_fp8());
  TpRunnerOptions to;
  to.tp = c.tp;
  to.expert_parallel = c.ep;
  TpRunner tp(cpu_opts(dir), to);
  for (int r = 0; r < tp.local_ranks(); ++r) {  // the rank's experts stayed e4m3 with their block scales
    const ops::MoeWeights& w = tp.rank_runner(r).model().weights().layers[1].moe;
    ASSERT_TRUE(w.is_fp8()) << "rank " << r;
    EXPECT_EQ(w.local_experts(), c.ep ? 4 / c.tp : 4);
    EXPECT_EQ(w.expert_begin, c.ep ? r * (4 / c.tp) : 0);
    EXPECT_EQ(w.intermediate(), c.ep ? 256 : 256 / c.tp);
    EXPECT_EQ(w.gate_up_scale.shape[1], 2 * w.intermediate() / 128);
  }
  std::vector<int32_t> prompt;
  for (int i = 0; i < 23; ++i) prompt.push_back((i * 37 + 5) % 300);
  const std::vector<float> a = prefill_logits(*full, prompt), b = prefill_logits(tp, prompt);
  const size_t V = 301;
  ASSERT_EQ(a.size(), prompt.size() * V);
  ASSERT_EQ(b.size(), a.size());
  double worst = 0;
  bool differs = false;
  for (size_t row = 0; row < prompt.size(); ++row) {
    const float* x = a.data() + row * V;
    const float* y = b.data() + row * V;
    const size_t best = size_t(std::max_element(x, x + V) - x);
    double amax = 0, second = -1e30, mx = -1e30, my = -1e30, sx = 0, sy = 0;
    for (size_t v = 0; v < V; ++v) {
      amax = std::max(amax, std::fabs(double(x[v])));
      if (v != best) second = std::max(second, double(x[v]));
      mx = std::max(mx, double(x[v]));
      my = std::max(my, double(y[v]));
      differs |= x[v] != y[v];
    }
    for (size_t v = 0; v < V; ++v) sx += std::exp(x[v] - mx), sy += std::exp(y[v] - my);
    const double bound = 2 * bf16_ulp(amax);
    const double d = std::fabs((y[best] - my - std::log(sy)) - (x[best] - mx - std::log(sx)));
    EXPECT_LE(d, bound) << "row " << row;
    worst = std::max(worst, d);
    if (double(x[best]) - second >= 2 * bound) {
      EXPECT_EQ(size_t(std::max_element(y, y + V) - y), best) << "row " << row;
    }
  }
  std::printf("  FP8 MoE TP=%d%s: |logprob - TP=1| max %.2e over %zu rows\n", c.tp, c.ep ? " EP" : "", worst,
              prompt.size());
  if (!c.ep) {
    EXPECT_TRUE(differs) << "the split sums in another order: some logit should move";
  }
}

INSTANTIATE_TEST_SUITE_P(Shards, TpMoeFp8, ::testing::Values(Case{2, false}, Case{2, true}, Case{4, true}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.tp) + (info.param.ep ? "_ep" : "_split");
                         });

// TP = 4 would cut each expert's 256 rows into 64-row slices, inside the 128 x 128 FP8 blocks: refused before
// any expert is read, naming the field, the block and the TP size.
TEST(TpMoeFp8Refusal, SplitOffTheBlockGridNamesTheSizes) {
  TpRunnerOptions to;
  to.tp = 4;
  test_support::expect_contains(
      test_support::error_of([&] { TpRunner r(cpu_opts(fp8_moe_checkpoint()), to); }),
      {"moe_intermediate_size (256)", "--tp 4", "128 x 128 FP8 block", "--enable-expert-parallel"});
}

}  // namespace
}  // namespace kiln
