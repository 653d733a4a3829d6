// Tensor parallelism on the CPU backend (issue 14): TP = 2 and 4 against TP = 1 on the HF fixtures (a
// block-FP8 one included: each rank's W8A8 partials are sums of whole 128-column blocks, so the bound below
// holds unchanged; Qwen3-MoE ones with each expert's intermediate split or whole experts per rank, ops/moe.h:
// the same sums in another order, and with the split y's bf16 rounding skipped, <= half a bf16 ulp of each
// expert's output, which the argument below covers as it covers one-ulp differences), driven
// by the real scheduler (chunked prefill, mixed batches, prefix cache, preemption) with check_integrity after
// every step; each rank's KV cache against TP = 1's; the broadcast command protocol; the engine; failures.
//
// The log-prob bound, per step: 2 x one bf16 ulp of the largest |logit| of that step (TP = 1's).
// Derivation: with the f32 all-reduce a TP rank computes every O / down output as the same fp32 sum of the
// same products as TP = 1, in another order, and rounds it once to bf16 as TP = 1 does; the two results are
// equal or one bf16 ulp apart (when a rounding boundary falls between the two fp32 sums, a difference of
// ~K x 2^-24 relative). Everything else (QKV, attention, gate/up, norms) is bitwise the same function of its
// inputs. Such one-ulp differences in the hidden state, no larger than the rounding the TP = 1 engine already
// does at each of those points, move each fp32 logit by much less than its bf16 ulp, so each bf16 logit stays
// or moves by one ulp (<= ulp(max |logit|)). The chosen token's log-prob, logit - logsumexp(logits), then
// moves by at most ulp(max |logit|) through its logit plus ulp(max |logit|) through logsumexp (which moves by
// no more than the largest change of any logit). Greedy tokens agree wherever TP = 1's top-2 margin is over
// that bound (the fixtures' margins are >= 0.1 nats, HF's path). The measured drift is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/hf_parity.h"
#include "dist/shard_plan.h"
#include "engine_test_util.h"
#include "kiln/error.h"
#include "runtime/engine.h"
#include "runtime/kv_pool.h"
#include "runtime/qwen3_runner.h"
#include "runtime/scheduler.h"
#include "runtime/tp_command.h"
#include "runtime/tp_runner.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

fs::path fixture(const std::string& name) {
  return fs::path(KILN_SOURCE_DIR) / "tests" / "fixtures" / "hf" / name;
}

EngineOptions cpu_opts(const std::string& name) {
  EngineOptions o;
  o.model_dir = fixture(name).string();
  o.device = "cpu";
  return o;
}

std::vector<std::vector<int32_t>> fixture_prompts(const std::string& name) {
  std::ifstream f(fixture(name) / "hf_reference.json");
  const nlohmann::json ref = nlohmann::json::parse(f);
  std::vector<std::vector<int32_t>> out;
  for (const auto& c : ref["cases"]) out.push_back(c["prompt_ids"].get<std::vector<int32_t>>());
  // Two more that share a prefix with the longest one (the prefix cache) and a long one (preemption).
  std::vector<int32_t> longest = out.back();
  longest.resize(std::min<size_t>(longest.size(), 24));
  longest.push_back(7);
  out.push_back(longest);
  std::vector<int32_t> big;
  for (int i = 0; i < 60; ++i) big.push_back((i * 37 + 11) % 500);
  out.push_back(big);
  return out;
}

double bf16_ulp(double x) {
  const double a = std::fabs(x);
  if (a < 1e-30) return 0;
  return std::ldexp(1.0, int(std::floor(std::log2(a))) - 7);
}

struct Outcome {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, std::vector<double>> logprobs, bounds, margins;
  int steps = 0, preemptions = 0;
};

// The engine's loop without threads: schedule -> forward -> greedy -> finalize, integrity after every step.
Outcome drive(ModelRunner& m, const std::vector<std::vector<int32_t>>& prompts, int new_tokens,
              int32_t num_pages, int32_t page_size) {
  m.allocate_kv(num_pages, page_size);
  KvPool pool(num_pages, page_size);
  SchedulerOptions so;
  so.chunked_prefill_size = 16;
  so.reserve_init = 0.0;  // admit greedily: the long prompt forces preemptions
  Scheduler sched(pool, so);
  std::map<uint64_t, size_t> plen;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto s = std::make_unique<Sequence>();
    s->id = i + 1;
    s->tokens = prompts[i];
    s->prompt_len = int32_t(prompts[i].size());
    s->max_len = s->prompt_len + new_tokens;
    plen[s->id] = prompts[i].size();
    sched.admit(std::move(s));
  }
  Outcome o;
  const int64_t V = m.config().vocab_size;
  std::vector<float> logits;
  for (;;) {
    StepPlan plan = sched.schedule();
    sched.check_integrity();
    if (plan.empty()) break;
    o.preemptions += int(plan.preempted.size());
    plan.batch.validate(V, pool.num_pages());
    m.forward(plan.batch, &logits, nullptr);
    std::vector<int32_t> sampled;
    for (size_t k = 0; k < plan.sample_rows.size(); ++k) {
      const float* row = logits.data() + k * size_t(V);
      const int32_t best = int32_t(std::max_element(row, row + V) - row);
      double mx = -1e30, second = -1e30, amax = 0, sum = 0;
      for (int64_t v = 0; v < V; ++v) {
        mx = std::max(mx, double(row[v]));
        amax = std::max(amax, std::fabs(double(row[v])));
        if (v != best) second = std::max(second, double(row[v]));
      }
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
      const uint64_t id = plan.rows[size_t(plan.sample_rows[k])].seq->id;
      o.tokens[id].push_back(best);
      o.logprobs[id].push_back(double(row[best]) - mx - std::log(sum));
      o.bounds[id].push_back(2 * bf16_ulp(amax));
      o.margins[id].push_back(double(row[best]) - second);
      sampled.push_back(best);
    }
    sched.finalize(plan, sampled);
    for (int32_t r : plan.sample_rows) {
      Sequence* s = plan.rows[size_t(r)].seq;
      if (int(s->tokens.size()) >= s->max_len) sched.release(s->id);
    }
    sched.check_integrity();
    ++o.steps;
  }
  return o;
}

// Each rank's KV cache holds exactly its KV heads: layer 0 bitwise TP = 1's heads (its input, the embedding,
// is replicated and the QKV rows are a slice), and ranks holding the same head (replicas) agree bitwise in
// every layer (their inputs are the all-reduced, identical hidden states).
void expect_rank_caches(Qwen3Runner& full, TpRunner& tp, const std::vector<int64_t>& slots) {
  const ModelConfig& c = tp.config();
  const int64_t D = c.head_dim;
  auto head = [&](const KvCache& cache, int layer, bool k, int64_t slot, int64_t h) {
    const ops::KvCacheView v = cache.layer(layer);
    const Tensor& t = k ? v.k : v.v;
    const int64_t ps = cache.page_size(), p = slot / ps, o = slot % ps;
    const bf16_t* base = t.ptr<bf16_t>() + p * t.stride[0] + o * t.stride[1] + h * t.stride[2];
    return std::vector<uint16_t>(reinterpret_cast<const uint16_t*>(base),
                                 reinterpret_cast<const uint16_t*>(base + D));
  };
  std::map<int64_t, int> holder;  // KV head -> the first local rank holding it
  for (int r = 0; r < tp.local_ranks(); ++r) {
    const dist::ShardPlan p = dist::make_shard_plan(c, tp.tp(), tp.global_rank(r));
    const KvCache& cache = tp.rank_runner(r).cache();
    ASSERT_EQ(cache.num_pages(), full.cache().num_pages());
    ASSERT_EQ(cache.layer(0).k.shape[2], p.kv_heads.size()) << "rank " << r << " holds its KV heads only";
    for (int64_t j = 0; j < p.kv_heads.size(); ++j) {
      const int64_t h = p.kv_heads.begin + j;
      for (int64_t s : slots)
        for (bool k : {true, false}) {
          ASSERT_EQ(head(cache, 0, k, s, j), head(full.cache(), 0, k, s, h))
              << "rank " << r << " head " << h << " slot " << s << (k ? " K" : " V");
        }
      if (auto it = holder.find(h); it != holder.end()) {
        const KvCache& other = tp.rank_runner(it->second).cache();
        const dist::ShardPlan po = dist::make_shard_plan(c, tp.tp(), tp.global_rank(it->second));
        for (int l = 0; l < int(c.num_layers); ++l)
          for (int64_t s : slots)
            ASSERT_EQ(head(cache, l, true, s, j), head(other, l, true, s, h - po.kv_heads.begin))
                << "replicas of head " << h << " differ at layer " << l;
      } else {
        holder[h] = r;
      }
    }
  }
}

struct Case {
  const char* fixture;
  int tp;
  bool ep = false;  // MoE: expert parallelism instead of each expert's intermediate split
};

class TpVsTp1 : public ::testing::TestWithParam<Case> {};

TEST_P(TpVsTp1, SameGreedyTokensLogprobsWithinTheBoundKvPerRank) {
  const Case cs = GetParam();
  const auto prompts = fixture_prompts(cs.fixture);
  const EngineOptions eo = cpu_opts(cs.fixture);
  constexpr int kNew = 12;
  constexpr int32_t kPageSize = 4;
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  // ~70 % of what every request wants at once (preemptions), and room for the longest alone.
  int32_t want = 0;
  for (const auto& p : prompts) want += int32_t(p.size()) + kNew;
  const int32_t kPages = std::max(want * 7 / 10, int32_t(longest) + kNew + 8) / kPageSize + 1;
  auto full = load_qwen3_runner(eo);
  const Outcome a = drive(*full, prompts, kNew, kPages, kPageSize);
  TpRunnerOptions to;
  to.tp = cs.tp;
  to.expert_parallel = cs.ep;
  TpRunner tp(eo, to);
  EXPECT_EQ(tp.config().num_heads, full->config().num_heads);  // the engine sees the whole model
  EXPECT_EQ(tp.kv_bytes_per_token() * tp.config().num_kv_heads,
            full->kv_bytes_per_token() * dist::make_shard_plan(tp.config(), cs.tp, 0).kv_heads.size());
  const Outcome b = drive(tp, prompts, kNew, kPages, kPageSize);
  EXPECT_GT(a.preemptions, 0) << "the pool is meant to be too small for every request at once";
  EXPECT_EQ(a.steps, b.steps);
  double worst = 0, sum = 0;
  int n = 0, parted = 0;
  for (const auto& [id, toks] : a.tokens) {
    ASSERT_EQ(b.tokens.at(id).size(), toks.size()) << "request " << id;
    for (size_t i = 0; i < toks.size(); ++i) {
      // Two paths may part only where TP = 1's top-2 margin is a near tie (< 2 x the bound: each of the two
      // logits may move by the bound); the tokens after that are other prompts' continuations.
      if (b.tokens.at(id)[i] != toks[i] && a.margins.at(id)[i] < 2 * a.bounds.at(id)[i]) {
        ++parted;
        break;
      }
      ASSERT_EQ(b.tokens.at(id)[i], toks[i])
          << "request " << id << " step " << i << " (TP = 1's top-2 margin " << a.margins.at(id)[i]
          << ", bound " << a.bounds.at(id)[i] << ")";
      const double d = std::fabs(b.logprobs.at(id)[i] - a.logprobs.at(id)[i]);
      EXPECT_LE(d, a.bounds.at(id)[i]) << "request " << id << " step " << i;
      worst = std::max(worst, d), sum += d, ++n;
    }
  }
  std::printf(
      "  %s TP=%d%s: %d steps, %d preemptions, %d greedy tokens equal (%d paths parted at a near tie); "
      "|logprob - TP=1| mean %.2e max %.2e\n",
      cs.fixture, cs.tp, cs.ep ? " EP" : "", b.steps, b.preemptions, n, parted, sum / n, worst);
  EXPECT_LE(parted, 1) << "more than one request parted at a near tie";
  // The caches after a fresh prefill of one prompt into the same slots.
  BatchDesc batch;
  batch.page_size = kPageSize;
  const std::vector<int32_t>& p = prompts[1];
  for (size_t i = 0; i < p.size(); ++i) {
    batch.tokens.push_back(p[i]);
    batch.positions.push_back(int32_t(i));
    batch.slot_mapping.push_back(int64_t(kPageSize) + int64_t(i));  // from page 1 on
  }
  const int32_t np = int32_t((p.size() + kPageSize - 1) / kPageSize);
  batch.cu_q = {0, int32_t(p.size())};
  batch.kv_lens = {int32_t(p.size())};
  batch.pages_stride = np;
  for (int32_t i = 0; i < np; ++i) batch.page_table.push_back(1 + i);
  batch.logit_rows = {int32_t(p.size()) - 1};
  std::vector<float> la, lb;
  full->forward(batch, &la, nullptr);
  tp.forward(batch, &lb, nullptr);
  expect_rank_caches(*full, tp, batch.slot_mapping);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, TpVsTp1,
    ::testing::Values(Case{"qwen3_gqa2_d128_untied", 2}, Case{"qwen3_gqa2_d128_untied", 4},
                      Case{"qwen3_gqa3_d32_tied", 2}, Case{"qwen3_gqa4_d64_tied", 2},
                      Case{"qwen3_gqa4_d64_tied", 4}, Case{"qwen3_yarn_d64", 4}, Case{"qwen3_fp8_tiny", 2},
                      Case{"qwen3_moe_norm_gqa4_tied", 2}, Case{"qwen3_moe_norm_gqa4_tied", 4, true},
                      Case{"qwen3_moe_norm_gqa4_tied_fused", 2},
                      Case{"qwen3_moe_norm_gqa4_tied_fused", 2, true},
                      Case{"qwen3_moe_nonorm_gqa2_untied", 4}, Case{"qwen3_moe_nonorm_gqa2_untied", 2, true},
                      Case{"qwen3_moe_step2_gqa3_untied", 2}),
    [](const auto& info) {
      return std::string(info.param.fixture) + "_tp" + std::to_string(info.param.tp) +
             (info.param.ep ? "_ep" : "");
    });

// `kiln generate --tp N` against Hugging Face's own greedy path and log-probs (the same bound as TP = 1's).
TEST(TpCli, GenerateWithTpMatchesHuggingFace) {
  for (const Case& c :
       {Case{"qwen3_gqa2_d128_untied", 4}, Case{"qwen3_gqa3_d32_tied", 2}, Case{"qwen3_gqa4_d64_tied", 4}}) {
    SCOPED_TRACE(std::string(c.fixture) + " --tp " + std::to_string(c.tp));
    test_support::check_hf_fixture_cli(fixture(c.fixture), 3, {"--tp", std::to_string(c.tp)});
  }
  // A Qwen3-MoE checkpoint, each expert's intermediate split and whole experts per rank.
  for (const bool ep : {false, true}) {
    SCOPED_TRACE(std::string("qwen3_moe_norm_gqa4_tied --tp 2") + (ep ? " --enable-expert-parallel" : ""));
    std::vector<std::string> extra = {"--tp", "2"};
    if (ep) extra.push_back("--enable-expert-parallel");
    test_support::check_hf_fixture_cli(fixture("qwen3_moe_norm_gqa4_tied"), 3, extra);
  }
}

TEST(TpRunner, ShapesThatDoNotDivideAreClearErrors) {
  TpRunnerOptions to;
  to.tp = 4;  // 6 query heads
  try {
    TpRunner r(cpu_opts("qwen3_gqa3_d32_tied"), to);
    FAIL() << "TP = 4 over 6 heads loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads (6) must be divisible by --tp 4"),
              std::string::npos)
        << e.what();
  }
}

// Block-FP8 weights are sliced on their 128 x 128 grid: a rank's intermediate slice of 64 rows (online
// quantization of a bf16 fixture with intermediate_size 128 at TP = 2) cuts blocks, and says so.
TEST(TpRunner, Fp8SlicesOffTheBlockGridAreClearErrors) {
  EngineOptions eo = cpu_opts("qwen3_gqa2_d128_untied");
  eo.quantization = "fp8";
  TpRunnerOptions to;
  to.tp = 2;
  try {
    TpRunner r(eo, to);
    FAIL() << "TP = 2 cut 128 x 128 FP8 blocks and loaded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("inside its 128 x 128 FP8 blocks"), std::string::npos) << m;
    EXPECT_NE(m.find("mlp.gate_proj.weight"), std::string::npos) << m;
  }
}

// Expert parallelism needs num_experts to divide; the error names the field.
TEST(TpRunner, ExpertParallelismOverExpertsThatDoNotDivideIsAClearError) {
  TpRunnerOptions to;
  to.tp = 2;  // 5 experts
  to.expert_parallel = true;
  try {
    TpRunner r(cpu_opts("qwen3_moe_step2_gqa3_untied"), to);
    FAIL() << "EP = 2 over 5 experts loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts (5) must be divisible by --tp 2"), std::string::npos)
        << e.what();
  }
}

// The protocol that carries calls to other nodes, run in one process: ranks 1.. decode every call from
// broadcasts. Same bits as reading it from memory.
TEST(TpRunner, BroadcastCommandsGiveTheSameBits) {
  const std::string fx = "qwen3_gqa4_d64_tied";
  const auto prompts = fixture_prompts(fx);
  TpRunnerOptions direct, bc;
  direct.tp = bc.tp = 4;
  bc.broadcast_commands = true;
  TpRunner a(cpu_opts(fx), direct), b(cpu_opts(fx), bc);
  const Outcome oa = drive(a, prompts, 6, 64, 4), ob = drive(b, prompts, 6, 64, 4);
  for (const auto& [id, lp] : oa.logprobs) {
    EXPECT_EQ(ob.tokens.at(id), oa.tokens.at(id));
    EXPECT_EQ(ob.logprobs.at(id), lp) << "request " << id;
  }
}

// bf16 partials (what CUDA runs: vLLM's and SGLang's all-reduce): two roundings instead of one, so a looser
// bound; the greedy tokens still agree on these fixtures.
TEST(TpRunner, Bf16AllReduceAgreesWithTp1) {
  const std::string fx = "qwen3_gqa2_d128_untied";
  const auto prompts = fixture_prompts(fx);
  auto full = load_qwen3_runner(cpu_opts(fx));
  TpRunnerOptions to;
  to.tp = 2;
  to.reduce = "bf16";
  TpRunner tp(cpu_opts(fx), to);
  const Outcome a = drive(*full, prompts, 8, 64, 4), b = drive(tp, prompts, 8, 64, 4);
  double worst = 0;
  for (const auto& [id, toks] : a.tokens) {
    EXPECT_EQ(b.tokens.at(id), toks) << "request " << id;
    for (size_t i = 0; i < toks.size(); ++i)
      worst = std::max(worst, std::fabs(b.logprobs.at(id)[i] - a.logprobs.at(id)[i]));
  }
  EXPECT_LE(worst, 0.25);
  std::printf("  bf16 all-reduce, TP=2: |logprob - TP=1| max %.2e\n", worst);
}

TEST(TpCommand, RoundTripAndCorruptInput) {
  TpCommand c;
  c.op = TpCommand::Op::forward;
  c.want_logits = true;
  c.graph.buckets = {1, 2, 4};
  c.batch.tokens = {5, 6, 7};
  c.batch.positions = {0, 1, 2};
  c.batch.slot_mapping = {4, 5, -1};
  c.batch.cu_q = {0, 2, 3};
  c.batch.kv_lens = {2, 1};
  c.batch.page_table = {1, 0};
  c.batch.pages_stride = 1;
  c.batch.page_size = 4;
  c.batch.logit_rows = {1, 2};
  const std::string p = tp_encode(c), h = tp_header(c, p.size());
  ASSERT_EQ(h.size(), kTpHeaderBytes);
  const TpCommand d = tp_decode(h.data(), p.data(), p.size());
  EXPECT_EQ(d.op, c.op);
  EXPECT_TRUE(d.want_logits);
  EXPECT_FALSE(d.want_hidden);
  EXPECT_EQ(d.graph.buckets, c.graph.buckets);
  EXPECT_EQ(d.batch.tokens, c.batch.tokens);
  EXPECT_EQ(d.batch.slot_mapping, c.batch.slot_mapping);
  EXPECT_EQ(d.batch.page_table, c.batch.page_table);
  EXPECT_EQ(d.batch.logit_rows, c.batch.logit_rows);
  EXPECT_THROW(tp_decode(h.data(), p.data(), p.size() - 1), Error);
  std::string bad = h;
  bad[0] ^= 1;
  EXPECT_THROW(tp_payload_bytes(bad.data()), Error);
  std::string lying = p;
  lying[9] = char(0x7f);  // the first vector's length runs past the payload
  EXPECT_THROW(tp_decode(h.data(), lying.data(), lying.size()), Error);
}

// A rank that fails in a step: the call throws RunnerFatalError naming it, at once (no hang), and the
// runner refuses every later call; its destructor joins every thread.
TEST(TpRunner, RankFailingInAStepStopsTheGroupWithoutHanging) {
  for (bool bc : {false, true}) {
    TpRunnerOptions to;
    to.tp = 4;
    to.fail_rank = 2;
    to.fail_collective = 3;  // within the first step (5 collectives; 2 more per command broadcast)
    to.broadcast_commands = bc;
    TpRunner tp(cpu_opts("qwen3_gqa4_d64_tied"), to);
    tp.allocate_kv(16, 4);
    BatchDesc b;
    b.page_size = 4;
    b.tokens = {1, 2, 3};
    b.positions = {0, 1, 2};
    b.slot_mapping = {4, 5, 6};
    b.cu_q = {0, 3};
    b.kv_lens = {3};
    b.page_table = {1};
    b.pages_stride = 1;
    b.logit_rows = {2};
    std::vector<float> logits;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      tp.forward(b, &logits, nullptr);
      FAIL() << "the injected failure did not surface";
    } catch (const RunnerFatalError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("tensor-parallel rank 2 failed: injected failure"), std::string::npos) << m;
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
    EXPECT_THROW(tp.forward(b, &logits, nullptr), RunnerFatalError);
  }
}

TEST(TpRunner, RankFailingAtLoadIsAClearError) {
  TpRunnerOptions to;
  to.tp = 2;
  to.fail_rank = 1;
  to.fail_at_load = true;
  try {
    TpRunner tp(cpu_opts("qwen3_gqa2_d128_untied"), to);
    FAIL() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("tensor-parallel rank 1 failed: injected failure: rank 1 while loading"),
        std::string::npos)
        << e.what();
  }
}

// Through the engine: TP = 2 and TP = 1 give the same greedy tokens for concurrent requests; a failing rank
// ends every request with its error and stops the engine, which then refuses submissions naming it.
TEST(TpEngine, SameTokensAsTp1AndAFailureStopsTheEngine) {
  const std::string fx = "qwen3_gqa2_d128_untied";
  const auto prompts = fixture_prompts(fx);
  EngineOptions eo = cpu_opts(fx);
  eo.page_size = 4;
  eo.max_total_tokens = 256;
  eo.chunked_prefill_size = 16;
  auto run = [&](std::unique_ptr<ModelRunner> r) {
    Engine e(std::move(r), eo);
    test::Sink sink;
    std::vector<RequestId> ids;
    for (const auto& p : prompts) {
      Request q = test::greedy(p, 10);
      q.sampling.ignore_eos = true;
      ids.push_back(e.submit(std::move(q), sink.cb()));
    }
    sink.wait_finished(int(ids.size()));
    std::vector<std::vector<int32_t>> out;
    for (RequestId id : ids) {
      EXPECT_EQ(sink.last(id).finish_reason, "length");
      out.push_back(sink.tokens(id));
    }
    test::expect_pool_clean(e);
    return out;
  };
  TpRunnerOptions to;
  to.tp = 2;
  const auto want = run(load_qwen3_runner(eo));
  EXPECT_EQ(run(std::make_unique<TpRunner>(eo, to)), want);

  to.fail_rank = 1;
  to.fail_collective = 40;
  Engine e(std::make_unique<TpRunner>(eo, to), eo);
  test::Sink sink;
  for (const auto& p : prompts) {
    Request q = test::greedy(p, 10);
    q.sampling.ignore_eos = true;
    e.submit(std::move(q), sink.cb());
  }
  sink.wait_finished(int(prompts.size()));
  sink.expect_one_finish_each();
  for (const auto& [id, evs] : sink.events) {
    EXPECT_EQ(evs.back().finish_reason, "error");
    EXPECT_NE(evs.back().error.find("tensor-parallel rank 1 failed"), std::string::npos) << evs.back().error;
  }
  EXPECT_NE(e.fatal_error().find("injected failure"), std::string::npos) << e.fatal_error();
  try {
    e.submit(test::greedy(prompts[0], 2), sink.cb());
    FAIL() << "a stopped engine took a request";
  } catch (const EngineBusyError& err) {
    EXPECT_NE(std::string(err.what()).find("tensor-parallel rank 1 failed"), std::string::npos) << err.what();
  }
}

// Embeddings (forward_hidden: no LM head, no gather) through TP = 2: the final hidden state is replicated.
TEST(TpEngine, EmbeddingsMatchTp1) {
  EngineOptions eo = cpu_opts("qwen3_embedding_hub");
  eo.page_size = 4;
  eo.max_total_tokens = 256;
  auto embed = [&](std::unique_ptr<ModelRunner> r) {
    Engine e(std::move(r), eo);
    test::Sink sink;
    Request q;
    q.prompt = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38};
    q.embedding = true;
    const RequestId id = e.submit(q, sink.cb());
    sink.wait_finished(1);
    return sink.last(id).embedding;
  };
  TpRunnerOptions to;
  to.tp = 2;
  const std::vector<float> a = embed(load_qwen3_runner(eo)), b = embed(std::make_unique<TpRunner>(eo, to));
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  double dot = 0;
  for (size_t i = 0; i < a.size(); ++i) dot += double(a[i]) * double(b[i]);
  EXPECT_GT(dot, 0.9999);  // unit vectors; bf16 hidden states
}

}  // namespace
}  // namespace kiln
