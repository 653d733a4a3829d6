// Qwen3-4B-shaped parity with Hugging Face transformers on the GPU. The checkpoint (random weights, real
// Qwen3-4B shape: 36 layers, hidden 2560, 32/8 heads, head_dim 128, vocab 151936, tied; ~8 GB) and its
// hf_reference.json come from tests/fixtures/make_hf_4b_reference.py (HF bf16, sdpa, CUDA, incremental
// decoding; and the same weights in fp32 teacher-forced on that path). Set KILN_HF4B_DIR to that directory;
// without it (or without a GPU) the tests skip and say so. For each prompt (128..1024 tokens): one prefill,
// then 64 decode steps teacher-forced on HF's greedy tokens (so one disagreement does not derail the rest),
// kiln's log-softmax compared with HF's at every step.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "common/model_steps.h"
#include "common/test_support.h"
#include "model/qwen3.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

using kiln::test_support::log_softmax;
using nlohmann::json;

// Greedy: kiln's argmax must equal HF's greedy token on every step that is not exempt, and on at least
// 62/64 of all steps over all prompts. The reference lists as exempt the steps where HF's bf16 top-1/top-2
// margin, or the lead of that token in HF fp32 (same weights, teacher-forced; negative where fp32 prefers
// another token), is below max(0.1, 1.5 x the largest change of that gap between HF's bf16 and fp32 paths on
// the case): there rounding decides the token, and two correct engines may differ. Random weights at 36
// layers may carry more rounding noise than a trained model's peaked logits reveal: where HF's own fp32 run
// (teacher-forced) disagrees with HF bf16 on more steps, kiln may miss up to 1.5x that many instead.
constexpr int kMaxMissPer64 = 2;
constexpr double kFp32MissFactor = 1.5;

// Log-prob of HF's greedy token, per step: 0.05 + 1.5 x (HF's own bf16-vs-fp32 drift on the case, max over
// its 64 steps), the rule of tests/unit/test_hf_parity.cpp. Why: kiln rounds to bf16 where HF's bf16 path
// rounds (docs/NUMERICS.md) but sums GEMMs and attention in another order and keeps attention
// probabilities in fp32 where sdpa rounds them to bf16. Even if kiln and HF bf16 were two bf16 paths with
// independent rounding noise around the fp32 result, each about HF's measured bf16-vs-fp32 drift from it,
// their distance would be ~sqrt(2) ~ 1.41x that drift (1.5x); sharing the rounding points keeps it lower
// (on the tiny fixtures kiln-vs-HF stayed below HF's own bf16-vs-fp32 drift). Plus 0.05 for the bf16
// rounding of a logit of std ~6. The drift is measured on this model (36 layers accumulate more noise than
// the 2-layer fixtures), so the bound scales with it. A bug (rope, norm, GQA, a weight, the cache) moves
// log-probs by O(1) nats.
double greedy_bound(const json& c) {
  return 0.05 + 1.5 * c["fp32"]["max_abs_diff"].get<double>();
}
// Mean over the steps: 0.02 + 1.5 x HF's mean bf16-vs-fp32 drift on the case.
double mean_bound(const json& c) {
  return 0.02 + 1.5 * c["fp32"]["mean_abs_diff"].get<double>();
}
// The 20 best tokens of HF's bf16 row at each step: the same rule with the drift measured on those tokens.
double top_bound(const json& c) {
  return 0.05 + 1.5 * c["fp32"]["top_max_abs_diff"].get<double>();
}

// FP8 E4M3 KV cache (one UE8M0 scale per 64 elements): PROVISIONAL bounds, to be tightened to ~1.5x the
// first measured drift. E4M3 keeps 3 mantissa bits, so each cached K/V element carries a relative rounding
// error up to 2^-4 (bf16: 2^-8), 16x more; under the q/k RMSNorm attention scores have std ~1, so each
// score moves by ~0.04 RMS and the softmax weights by ~4 %, which through 36 layers should move the final
// log-probs by tenths of a nat, not whole nats. The fp8-only code (block scale, quantize, dequantize in
// the attention kernels) fails by powers of two when wrong: O(1) nats and a broken greedy path. Hence:
// per step the bf16 bound + 0.5, mean the bf16 mean bound + 0.15, greedy on >= 90 % of the robust steps;
// the top-20 drift is only reported. For scale: kiln's CPU with an fp8 cache on the 2-layer fixture
// qwen3_gqa2_d128_untied drifts from HF by up to 0.28 on the greedy token (bf16 cache: 0.063) and 0.79 on
// the top-20 tokens (bf16: 0.29).
constexpr double kFp8StepSlack = 0.5, kFp8MeanSlack = 0.15, kFp8MinRobustAgree = 0.90;

struct CaseResult {
  size_t prompt_len = 0;
  int steps = 0, agree = 0, exempt = 0, robust_miss = 0;
  std::string robust_miss_steps;
  double max_d = 0, mean_d = 0, top_max = 0;
  int over_bound = 0;  // steps whose greedy-token drift exceeds the per-step bound (+ slack)
  std::string first_over;
};

class CudaModelHf4b : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* d = std::getenv("KILN_HF4B_DIR");
    if (!d || !*d || !cuda_available()) return;  // SetUp skips and says why
    dir_ = d;
    try {
      std::ifstream f(dir_ + "/hf_reference.json");
      if (!f) throw std::runtime_error("cannot open " + dir_ + "/hf_reference.json");
      ref_ = json::parse(f);
      LoadOptions o;
      o.device = Device::cuda();
      model_ = Qwen3Model::load(dir_, o);
    } catch (const std::exception& e) {
      load_error_ = e.what();
    }
  }
  static void TearDownTestSuite() { model_.reset(); }
  void SetUp() override {
    KILN_REQUIRE_GPU();
    if (dir_.empty())
      GTEST_SKIP() << "KILN_HF4B_DIR not set: generate the checkpoint with "
                      "tests/fixtures/make_hf_4b_reference.py --out DIR, then KILN_HF4B_DIR=DIR";
    ASSERT_TRUE(load_error_.empty()) << load_error_;
    ASSERT_TRUE(model_ != nullptr);
    const ModelConfig& c = model_->config();
    ASSERT_EQ(c.num_layers, 36);
    ASSERT_EQ(c.hidden_size, 2560);
    ASSERT_EQ(c.vocab_size, 151936);
    ASSERT_TRUE(ref_.contains("cases") && ref_["cases"].size() >= 4u);
  }

  // kiln on the GPU, teacher-forced on HF's greedy path of case c, against HF's numbers. step_slack: added
  // to the per-step bound.
  static CaseResult run_case(const json& c, DType cache, double step_slack) {
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["greedy_ids"].get<std::vector<int32_t>>();
    const auto hf_lp = c["greedy_logprobs"].get<std::vector<double>>();
    const auto top_ids = c["top_ids"].get<std::vector<std::vector<int32_t>>>();
    const auto top_lp = c["top_logprobs"].get<std::vector<std::vector<double>>>();
    const auto ex = c["exempt_steps"].get<std::vector<int>>();
    const std::set<int> exempt(ex.begin(), ex.end());
    const double bound = greedy_bound(c) + step_slack;
    const auto logits =
        test::model_steps(*model_, prompt, int(want.size()), want, cache, ops::KvLayout::hnd, 32);
    CaseResult r;
    r.prompt_len = prompt.size();
    r.steps = int(want.size());
    r.exempt = int(exempt.size());
    double sum = 0;
    for (size_t s = 0; s < want.size(); ++s) {
      const auto lp = log_softmax(logits[s].data(), int64_t(logits[s].size()));
      const int32_t g = test::argmax(logits[s]);
      r.agree += g == want[s];
      if (g != want[s] && !exempt.count(int(s))) {
        ++r.robust_miss;
        r.robust_miss_steps += " " + std::to_string(s) + " (kiln " + std::to_string(g) + ", HF " +
                               std::to_string(want[s]) + ", HF margin " + c["margins"][s].dump() + ")";
      }
      const double d = std::abs(lp[size_t(want[s])] - hf_lp[s]);
      sum += d;
      r.max_d = std::max(r.max_d, d);
      if (d > bound && r.over_bound++ == 0)
        r.first_over = "step " + std::to_string(s) + ": kiln " + std::to_string(lp[size_t(want[s])]) +
                       ", HF bf16 " + std::to_string(hf_lp[s]) + ", HF fp32 " +
                       c["fp32"]["logprobs_on_bf16_path"][s].dump();
      for (size_t k = 0; k < top_ids[s].size(); ++k)
        r.top_max = std::max(r.top_max, std::abs(lp[size_t(top_ids[s][k])] - top_lp[s][k]));
    }
    r.mean_d = sum / double(want.size());
    return r;
  }

  static void print_row(const char* cache, const json& c, const CaseResult& r, double step_slack,
                        double mean_slack) {
    std::printf(
        "hf4b %-5s | prompt %4zu | greedy %2d/%d (exempt %2d, robust misses %d) | |dlogprob| max %.4f "
        "(bound %.3f) mean %.4f (bound %.3f) | top-20 max %.4f (bf16 bound %.3f) | HF bf16-vs-fp32 max %.4f "
        "mean %.4f\n",
        cache, r.prompt_len, r.agree, r.steps, r.exempt, r.robust_miss, r.max_d, greedy_bound(c) + step_slack,
        r.mean_d, mean_bound(c) + mean_slack, r.top_max, top_bound(c),
        c["fp32"]["max_abs_diff"].get<double>(), c["fp32"]["mean_abs_diff"].get<double>());
  }

  static inline std::string dir_, load_error_;
  static inline json ref_;
  static inline std::unique_ptr<Qwen3Model> model_;
};

TEST_F(CudaModelHf4b, Bf16CacheMatchesTransformers) {
  int agree = 0, total = 0, fp32_miss = 0;
  for (const json& c : ref_["cases"]) {
    const CaseResult r = run_case(c, DType::bf16, 0.0);
    print_row("bf16", c, r, 0.0, 0.0);
    SCOPED_TRACE("prompt of " + std::to_string(r.prompt_len) + " tokens");
    EXPECT_EQ(r.robust_miss, 0) << "greedy differs on robust steps:" << r.robust_miss_steps;
    EXPECT_EQ(r.over_bound, 0) << r.over_bound << " steps over the bound " << greedy_bound(c) << "; first "
                               << r.first_over;
    EXPECT_LE(r.mean_d, mean_bound(c));
    EXPECT_LE(r.top_max, top_bound(c));
    agree += r.agree;
    total += r.steps;
    fp32_miss += r.steps - c["fp32"]["agree_steps"].get<int>();
  }
  const int allowed = std::max(kMaxMissPer64 * total / 64, int(std::ceil(kFp32MissFactor * fp32_miss)));
  std::printf("hf4b bf16: greedy %d/%d overall (misses allowed %d; HF fp32 vs bf16 misses %d)\n", agree,
              total, allowed, fp32_miss);
  EXPECT_LE(total - agree, allowed) << "greedy agreement " << agree << "/" << total;
}

TEST_F(CudaModelHf4b, Fp8CacheWithinProvisionalBounds) {
  int robust_agree = 0, robust_total = 0;
  for (const json& c : ref_["cases"]) {
    const CaseResult r = run_case(c, DType::f8e4m3, kFp8StepSlack);
    print_row("fp8", c, r, kFp8StepSlack, kFp8MeanSlack);
    SCOPED_TRACE("prompt of " + std::to_string(r.prompt_len) + " tokens");
    EXPECT_EQ(r.over_bound, 0) << r.over_bound << " steps over the bound " << greedy_bound(c) + kFp8StepSlack
                               << "; first " << r.first_over;
    EXPECT_LE(r.mean_d, mean_bound(c) + kFp8MeanSlack);
    robust_total += r.steps - r.exempt;
    robust_agree += r.steps - r.exempt - r.robust_miss;
  }
  std::printf("hf4b fp8: greedy on robust steps %d/%d\n", robust_agree, robust_total);
  EXPECT_GE(double(robust_agree), kFp8MinRobustAgree * double(robust_total));
}

}  // namespace
}  // namespace kiln
