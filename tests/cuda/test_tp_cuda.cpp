// Tensor parallelism on one GPU (issue 14): the TP runner with a one-rank NCCL group runs the whole TP path
// (sharded loading with the full slices, the NCCL all-reduce after O and down, the vocab-parallel LM head's
// all-gather, all captured in the decode CUDA graphs) and must give the non-TP runner's logits bit for bit
// (a one-rank bf16 sum is the identity), eagerly (prefill) and from the graphs (decode), and the same tokens
// from the device sampler; the Qwen3-MoE fixtures too (the MoE output all-reduced like the dense down
// projection's), also with expert parallelism loaded (one rank holds experts [0, E); test_cuda_moe_ep.cpp
// runs the shares of several ranks on one GPU). Several ranks need several GPUs (the multi-GPU issue).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "common/fp8_checkpoints.h"
#include "dist/nccl_comm.h"
#include "kiln/error.h"
#include "runtime/qwen3_runner.h"
#include "runtime/tp_runner.h"
#include "test_util_cuda.h"

namespace kiln {
namespace {

EngineOptions gpu_opts(const std::string& fixture) {
  EngineOptions o;
  o.model_dir = (std::filesystem::path(KILN_SOURCE_DIR) / "tests/fixtures/hf" / fixture).string();
  o.device = "cuda:0";
  return o;
}

BatchDesc step(const std::vector<int32_t>& seq, int32_t start, int32_t n, int32_t page_size, int32_t pages) {
  BatchDesc b;
  b.page_size = page_size;
  for (int32_t p = start; p < start + n; ++p) {
    b.tokens.push_back(seq[size_t(p)]);
    b.positions.push_back(p);
    b.slot_mapping.push_back(int64_t(page_size) + p);  // from page 1 on (page 0: the null page)
  }
  b.cu_q = {0, n};
  b.kv_lens = {start + n};
  b.pages_stride = pages;
  for (int32_t i = 0; i < pages; ++i) b.page_table.push_back(1 + i);
  b.logit_rows = {n - 1};
  return b;
}

// The one-rank TP runner (expert parallelism or not) against the plain runner on eo's checkpoint: bitwise
// logits eagerly and from the graphs, the same sampled tokens.
void expect_one_rank_equals_plain(const EngineOptions& eo, bool ep) {
  auto plain = load_qwen3_runner(eo);
  TpRunnerOptions to;
  to.tp = 1;  // the TP path with one rank
  to.expert_parallel = ep;
  TpRunner tp(eo, to);
  ASSERT_NE(tp.rank_runner(0).model().tp(), nullptr) << "the rank's model must run the TP code path";
  constexpr int32_t kPage = 16, kPages = 8;
  ModelRunner::GraphPlan gp;
  gp.buckets = {1, 2, 4};
  gp.max_pages_per_seq = kPages;
  gp.max_step_tokens = 256;
  gp.max_seqs = 4;
  for (ModelRunner* r : {static_cast<ModelRunner*>(plain.get()), static_cast<ModelRunner*>(&tp)}) {
    r->allocate_kv(kPages + 1, kPage);
    r->prepare_graphs(gp);
  }
  EXPECT_GT(tp.rank_runner(0).num_graphs(), 0) << "graphs captured with the NCCL collectives inside";
  std::vector<int32_t> seq = {11, 42, 7, 300, 5, 19, 77, 260, 1, 2, 3, 4, 5};
  int32_t done = 0;
  for (int s = 0; s < 12; ++s) {
    const int32_t n = int32_t(seq.size()) - done;
    const BatchDesc b = step(seq, done, n, kPage, kPages);
    if (s > 0) {
      ASSERT_EQ(tp.graph_bucket(b), 1) << "decode steps replay the graphs";
    }
    std::vector<float> la, lb;
    plain->forward(b, &la, nullptr);
    tp.forward(b, &lb, nullptr);
    ASSERT_EQ(la.size(), lb.size());
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << "step " << s;
    // The device sampler on rank 0 (greedy) picks the same token from the same logits.
    std::vector<ModelRunner::RowSampling> rows(1);
    rows[0].temperature = 0.0f;
    std::vector<ModelRunner::SampledRow> oa, ob;
    ASSERT_TRUE(plain->forward_sampled(b, rows, 0, &oa));  // rewrites the same K/V
    ASSERT_TRUE(tp.forward_sampled(b, rows, 0, &ob));
    ASSERT_EQ(oa[0].token, ob[0].token) << "step " << s;
    ASSERT_EQ(oa[0].logprob, ob[0].logprob) << "step " << s;
    done += n;
    seq.push_back(oa[0].token);
  }
}

TEST(TpCuda, OneRankNcclGroupEqualsTheNonTpRunnerEagerAndInGraphs) {
  KILN_REQUIRE_GPU();
  if (!dist::nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  const std::vector<std::pair<const char*, bool>> cases = {
      {"qwen3_gqa2_d128_untied", false},   {"qwen3_gqa4_d64_tied", false},
      {"qwen3_moe_norm_gqa4_tied", false}, {"qwen3_moe_step2_gqa3_untied", false},
      {"qwen3_moe_norm_gqa4_tied", true},  {"qwen3_moe_step2_gqa3_untied", true}};
  for (const auto& [fx, ep] : cases) {
    SCOPED_TRACE(std::string(fx) + (ep ? " expert parallel" : ""));
    expect_one_rank_equals_plain(gpu_opts(fx), ep);
  }
}

// Block-FP8 experts (Qwen3-30B-A3B-FP8's layout) through the sharded loader: e4m3 on the device as the plain
// loader places them, each expert's intermediate whole (one rank) or whole experts.
TEST(TpCuda, OneRankWithFp8ExpertsEqualsTheNonTpRunner) {
  KILN_REQUIRE_GPU();
  if (!dist::nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  EngineOptions eo;
  eo.model_dir = test::write_fp8_expert_moe_checkpoint("tp_cuda_fp8_moe").string();
  eo.device = "cuda:0";
  for (const bool ep : {false, true}) {
    SCOPED_TRACE(ep ? "expert parallel" : "tensor parallel");
    expect_one_rank_equals_plain(eo, ep);
  }
}

// Two ranks sharing device 0 would let one GPU test TP = 2. NCCL refuses two ranks of one communicator on
// the same GPU ("Duplicate GPU detected"), and kiln's per-device CUDA scratch and cuBLASLt engine are shared
// by every thread of a device: TP = 2 needs two GPUs. This records NCCL's answer.
TEST(TpCuda, NcclRefusesTwoRanksOnOneGpu) {
  KILN_REQUIRE_GPU();
  if (!dist::nccl_available()) GTEST_SKIP() << "this build has no NCCL";
  try {
    auto comms = dist::nccl_local_group({0, 0});
    std::printf("  NCCL accepted two ranks on GPU 0 (kiln still runs one rank per GPU)\n");
  } catch (const Error& e) {
    std::printf("  NCCL refuses two ranks on GPU 0: %s\n", e.what());
  }
}

}  // namespace
}  // namespace kiln
