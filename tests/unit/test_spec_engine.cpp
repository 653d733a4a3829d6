// Speculative decoding through the engine (runtime/engine_spec.cpp): n-gram verify steps give exactly the
// tokens of plain decoding (greedy on FakeRunner, whose every step re-reads the paged context, and on a
// small random Qwen3 checkpoint on the CPU backend), seeded sampling reproduces whatever the batch, and the
// page-table reserve / rollback keeps the scheduler's reference accounting exact.
#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/test_support.h"
#include "engine_test_util.h"
#include "kiln/safetensors.h"
#include "model/weights.h"
#include "runtime/fake_runner.h"
#include "runtime/qwen3_runner.h"
#include "runtime/scheduler.h"
#include "spec/kv_extent.h"

namespace kiln {
namespace {

using test::expect_pool_clean;
using test::greedy;
using test::Sink;

EngineOptions with_ngram(EngineOptions o, int k) {
  o.speculative.algorithm = spec::SpecAlgorithm::ngram;
  o.speculative.num_draft_tokens = k;
  o.speculative.ngram_min = 1;
  o.speculative.ngram_max = 4;
  o.speculative.off_switch = false;  // the tests here verify every step they can (test_spec_off_switch)
  return o;
}

// Prompts that quote themselves: a random block three times, then its first two tokens.
std::vector<std::vector<int32_t>> repeating_prompts(int vocab, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> block;
    for (int j = 0; j < 5 + i % 7; ++j) block.push_back(int32_t(rng() % uint32_t(vocab)));
    std::vector<int32_t> p;
    for (int r = 0; r < 3; ++r) p.insert(p.end(), block.begin(), block.end());
    p.insert(p.end(), block.begin(), block.begin() + 2);  // mid-quote: the drafter proposes the block's rest
    out.push_back(p);
  }
  return out;
}

struct Outputs {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::string> reasons;
  EngineStats stats;
};

Outputs run(std::unique_ptr<Engine> engine_ptr, const std::vector<std::vector<int32_t>>& prompts,
            int new_tokens, bool one_at_a_time, const std::function<void(size_t, Request&)>& edit = {}) {
  Engine& engine = *engine_ptr;
  Sink sink;
  std::vector<RequestId> ids;
  for (const auto& p : prompts) {
    Request r = greedy(p, new_tokens);
    if (edit) edit(ids.size(), r);
    ids.push_back(engine.submit(r, sink.cb()));
    if (one_at_a_time) sink.wait_finished(int(ids.size()));
  }
  sink.wait_finished(int(prompts.size()));
  sink.expect_one_finish_each();
  Outputs out;
  for (RequestId id : ids) {
    out.tokens.push_back(sink.tokens(id));
    out.reasons.push_back(sink.last(id).finish_reason);
  }
  expect_pool_clean(engine);
  out.stats = engine.stats();
  return out;
}

// FakeRunner over 3 tokens: drafts are right about a third of the time, so verify rows keep some drafts and
// reject others; a tight pool makes drafts compete for pages (and preempt).
TEST(SpecEngine, FakeRunnerGreedyEqualsReference) {
  for (const bool tight : {false, true}) {
    for (const int32_t eos : {-1, 1}) {
      const auto prompts = repeating_prompts(3, 6, 11);
      const EngineOptions o = with_ngram(test::small_opts(tight ? 96 : 4096, 4, 16), 4);
      const Outputs got =
          run(std::make_unique<Engine>(std::make_unique<FakeRunner>(3, 8, eos), o), prompts, 24, false);
      const FakeRunner ref(3, 8, eos);
      for (size_t i = 0; i < prompts.size(); ++i)
        EXPECT_EQ(got.tokens[i], ref.reference(prompts[i], 24, eos >= 0))
            << "prompt " << i << " tight " << tight;
      const spec::SpecStats& s = got.stats.spec;
      EXPECT_GT(s.drafts, 0);
      EXPECT_GT(s.accepted_tokens, 0);
      EXPECT_LT(s.accepted_tokens, s.draft_tokens);
      EXPECT_EQ(got.stats.generation_tokens_total, [&] {
        int64_t n = 0;
        for (const auto& t : got.tokens) n += int64_t(t.size());
        return n;
      }());
    }
  }
}

// The n-gram indexes filled while each step's forward runs (SpecOptions::index_during_forward; FakeRunner
// with device sampling calls before_sample where a device's forward would be running): the same drafts, the
// same tokens as indexing only when drafting, and every prompt token indexed during a forward, chunk by chunk
// (prompts of 23 to 41 tokens in chunks of 16).
TEST(SpecEngine, IndexDuringForwardDraftsWhatLateIndexingDrafts) {
  const auto prompts = repeating_prompts(3, 6, 7);
  int64_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += int64_t(p.size());
  const auto go = [&](bool during) {
    EngineOptions o = with_ngram(test::small_opts(4096, 4, 16), 4);
    o.speculative.index_during_forward = during;
    auto model = std::make_unique<FakeRunner>(3, 8, -1);
    model->device_sampling = true;
    return run(std::make_unique<Engine>(std::move(model), o), prompts, 24, false);
  };
  const Outputs late = go(false), early = go(true);
  EXPECT_EQ(early.tokens, late.tokens);
  const FakeRunner ref(3, 8, -1);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(early.tokens[i], ref.reference(prompts[i], 24, false));
  EXPECT_GT(late.stats.spec.drafts, 0);
  EXPECT_EQ(early.stats.spec.drafts, late.stats.spec.drafts);
  EXPECT_EQ(early.stats.spec.draft_tokens, late.stats.spec.draft_tokens);
  EXPECT_EQ(early.stats.spec.accepted_tokens, late.stats.spec.accepted_tokens);
  EXPECT_EQ(late.stats.spec.indexed_during_forward, 0);
  EXPECT_GE(early.stats.spec.indexed_during_forward, prompt_tokens);
}

// Each request's tokens, log-probs (as float bits) and top alternatives (id, log-prob bits), in order.
struct TokenLogprobs {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<uint32_t>> logprobs;
  std::vector<std::vector<std::pair<int32_t, uint32_t>>> top;
  bool operator==(const TokenLogprobs&) const = default;
};

// The engine's output for greedy requests asking for log-probs and the top 2 (edit: per request changes),
// submitted together or one at a time.
TokenLogprobs collect_logprobs(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                               int new_tokens, bool one_at_a_time,
                               const std::function<void(size_t, Request&)>& edit = {}) {
  Sink sink;
  std::vector<RequestId> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r = greedy(prompts[i], new_tokens);
    r.sampling.return_logprob = true;
    r.sampling.top_logprobs = 2;
    if (edit) edit(i, r);
    ids.push_back(engine.submit(r, sink.cb()));
    if (one_at_a_time) sink.wait_finished(int(ids.size()));
  }
  sink.wait_finished(int(ids.size()));
  TokenLogprobs out;
  std::lock_guard<std::mutex> lk(sink.mu);
  for (RequestId id : ids) {
    out.tokens.emplace_back();
    out.logprobs.emplace_back();
    out.top.emplace_back();
    for (const TokenEvent& e : sink.events[id]) {
      EXPECT_EQ(e.logprobs.size(), e.ids.size());
      EXPECT_EQ(e.top_logprobs.size(), e.ids.size());
      out.tokens.back().insert(out.tokens.back().end(), e.ids.begin(), e.ids.end());
      for (float x : e.logprobs) out.logprobs.back().push_back(std::bit_cast<uint32_t>(x));
      for (const auto& t : e.top_logprobs)
        for (const TokenLogprob& x : t) out.top.back().emplace_back(x.id, std::bit_cast<uint32_t>(x.logprob));
    }
  }
  return out;
}

// Logprobs and top alternatives of verified tokens are those plain decoding reports, position by position,
// with the processing (a frequency penalty, a bias) counting the kept drafts as generated.
TEST(SpecEngine, LogprobsEqualPlainDecoding) {
  const auto prompts = repeating_prompts(3, 4, 13);
  const auto edit = [](size_t i, Request& r) {
    if (i % 2) r.sampling.frequency_penalty = 0.3f;
    if (i == 2) r.sampling.logit_bias = {{1, 0.25f}};
  };
  auto collect = [&](const EngineOptions& o) {
    Engine engine(std::make_unique<FakeRunner>(3), o);
    return collect_logprobs(engine, prompts, 16, false, edit);
  };
  const EngineOptions o = test::small_opts(4096, 4, 16);
  EXPECT_EQ(collect(with_ngram(o, 4)), collect(o));
}

// A verify step whose forward fails ends exactly its requests with "error", gives their draft pages back, and
// the engine goes on serving.
TEST(SpecEngine, FailedVerifyStepEndsOnlyItsRequests) {
  struct FailingVerify : FakeRunner {
    FailingVerify() : FakeRunner(3) {}
    bool failed = false;
    void forward(const BatchDesc& b, std::vector<float>* logits, std::vector<float>* hidden) override {
      // Only a verify step asks for more logit rows than it has sequences.
      if (!failed && b.logit_rows.size() > size_t(b.num_seqs())) {
        failed = true;
        KILN_FAIL("injected verify failure");
      }
      FakeRunner::forward(b, logits, hidden);
    }
  };
  const EngineOptions o = with_ngram(test::small_opts(4096, 4, 16), 4);
  Engine engine(std::make_unique<FailingVerify>(), o);
  Sink sink;
  const auto prompts = repeating_prompts(3, 3, 9);
  std::vector<RequestId> ids;
  for (const auto& p : prompts) ids.push_back(engine.submit(greedy(p, 16), sink.cb()));
  sink.wait_finished(int(ids.size()));
  int errors = 0;
  for (RequestId id : ids) errors += sink.last(id).finish_reason == "error";
  EXPECT_GE(errors, 1);
  const RequestId after = engine.submit(greedy(prompts[0], 16), sink.cb());
  sink.wait_finished(int(ids.size()) + 1);
  EXPECT_EQ(sink.tokens(after), FakeRunner(3).reference(prompts[0], 16, false));
  sink.expect_one_finish_each();
  expect_pool_clean(engine);
}

// A seeded sampled request draws from its own generator: the same tokens alone or in a batch, with
// penalties and a bias (the verifier's per-position processing).
TEST(SpecEngine, SeededSamplingIsIndependentOfTheBatch) {
  const auto prompts = repeating_prompts(3, 5, 5);
  auto edit = [](size_t i, Request& r) {
    r.sampling.temperature = 0.8f;
    r.sampling.top_k = i % 2 ? 2 : -1;
    r.sampling.seed = int64_t(100 + i);
    if (i == 2) r.sampling.frequency_penalty = 0.5f;
    if (i == 3) r.sampling.logit_bias = {{0, 0.7f}};
  };
  const EngineOptions o = with_ngram(test::small_opts(4096, 4, 16), 3);
  const Outputs batched =
      run(std::make_unique<Engine>(std::make_unique<FakeRunner>(3), o), prompts, 20, false, edit);
  const Outputs alone =
      run(std::make_unique<Engine>(std::make_unique<FakeRunner>(3), o), prompts, 20, true, edit);
  EXPECT_EQ(batched.tokens, alone.tokens);
  EXPECT_GT(batched.stats.spec.accepted_tokens, 0);
  for (const auto& t : batched.tokens) EXPECT_EQ(t.size(), 20u);
}

// Sampling on the device (FakeRunner's device sampler: a draw keyed by the request's seed and token number):
// the verify step draws each position as the plain step drawing that token would and keeps the drafts equal
// to the draws, so seeded sampled outputs with n-gram are plain decoding's token for token, batched or not,
// while drafts are kept; rows with a logit processor take the host rule (not compared here).
TEST(SpecEngine, DeviceSampledOutputsEqualPlainDecoding) {
  const auto prompts = repeating_prompts(3, 6, 7);
  auto edit = [](size_t i, Request& r) {
    r.sampling.temperature = i % 3 == 0 ? 0.0f : 0.7f + 0.1f * float(i);
    r.sampling.top_k = i % 2 ? 2 : -1;
    r.sampling.seed = int64_t(200 + i);
  };
  const auto engine = [](bool ngram) {
    auto m = std::make_unique<FakeRunner>(3);
    m->device_sampling = true;
    EngineOptions o = test::small_opts(4096, 4, 16);
    return std::make_unique<Engine>(std::move(m), ngram ? with_ngram(o, 3) : o);
  };
  const Outputs plain = run(engine(false), prompts, 24, true, edit);
  for (const bool one_at_a_time : {true, false}) {
    const Outputs spec = run(engine(true), prompts, 24, one_at_a_time, edit);
    EXPECT_EQ(spec.tokens, plain.tokens) << (one_at_a_time ? "alone" : "batched");
    EXPECT_GT(spec.stats.spec.verify_steps, 0);
    EXPECT_GT(spec.stats.spec.accepted_tokens, 0) << "drafts kept";
    EXPECT_LT(spec.stats.spec.accepted_tokens, spec.stats.spec.draft_tokens) << "and drafts rejected";
  }
}

// The page-table half on its own: reserve pages for drafts, commit some, roll back; the scheduler's exact
// reference accounting holds after each move, and a full pool shortens the draft instead of failing.
TEST(SpecEngine, ReserveAndRollbackKeepThePoolExact) {
  KvPool pool(12, 4);  // 11 usable pages of 4
  SchedulerOptions so;
  Scheduler sched(pool, so);
  auto seq = std::make_unique<Sequence>();
  seq->id = 1;
  seq->tokens = {1, 2, 3, 4, 5, 6};
  seq->prompt_len = 6;
  seq->max_len = 40;
  sched.admit(std::move(seq));
  StepPlan prefill = sched.schedule();
  sched.finalize(prefill, {7});  // 7 tokens, 6 computed, 2 pages
  sched.check_integrity();
  StepPlan step = sched.schedule();
  ASSERT_EQ(step.rows.size(), 1u);
  Sequence& s = *step.rows[0].seq;
  EXPECT_EQ(step.rows[0].begin, 6);
  EXPECT_EQ(spec::reserve_draft_pages(pool, s.pages, 6 + 1 + 9), 16);  // positions 6..15: 4 pages
  EXPECT_EQ(s.pages.size(), 4u);
  sched.check_integrity();
  // Two of nine drafts kept and the target's token: 3 tokens, positions 6..8 computed for real.
  s.tokens.insert(s.tokens.end(), {8, 9});
  step.rows[0].q_len = 3;
  sched.finalize(step, {10});
  spec::rollback_pages(pool, s.pages, int32_t(s.tokens.size()));
  EXPECT_EQ(s.num_computed, 9);
  EXPECT_EQ(s.pages.size(), 3u);  // 10 tokens: pages for positions 0..11
  sched.check_integrity();
  EXPECT_EQ(pool.num_free(), 11 - 3);
  // A pool with one free page covers what it can.
  std::vector<int32_t> hog;
  ASSERT_TRUE(pool.alloc(pool.num_free() - 1, hog));
  EXPECT_EQ(spec::reserve_draft_pages(pool, s.pages, 10 + 20), 16);
  EXPECT_EQ(pool.num_free(), 0);
  spec::rollback_pages(pool, s.pages, int32_t(s.tokens.size()));
  pool.unref_all(hog);
  sched.check_integrity();
  sched.release(1);
  sched.flush_cache();
  sched.check_integrity();
  EXPECT_EQ(pool.num_free(), 11);
}

// A small Qwen3 (random bf16 weights, untied embeddings, a 512-token vocabulary) on the CPU backend.
std::string write_small_checkpoint() {
  static const std::string written = [] {
    namespace fs = std::filesystem;
    const char* config = R"({
      "architectures": ["Qwen3ForCausalLM"], "dtype": "bfloat16", "eos_token_id": 511, "head_dim": 32,
      "hidden_act": "silu", "hidden_size": 128, "intermediate_size": 256, "max_position_embeddings": 4096,
      "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
      "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
      "tie_word_embeddings": false, "vocab_size": 512})";
    const fs::path dir = test_support::process_scratch_dir("spec_engine") / "ckpt";
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << config;
    const ModelConfig cfg = parse_model_config(config, "small config");
    write_safetensors((dir / "model.safetensors").string(),
                      random_weights(qwen3_weight_specs(cfg), 3).tensors, {{"format", "pt"}});
    return dir.string();
  }();
  return written;
}

TEST(SpecEngine, Qwen3CpuGreedyIdenticalWithAndWithoutNgram) {
  EngineOptions base = test::small_opts(8192, 8, 64);
  base.model_dir = write_small_checkpoint();
  base.device = "cpu";
  const auto prompts = repeating_prompts(500, 5, 21);
  for (const bool one_at_a_time : {true, false}) {
    auto go = [&](const EngineOptions& o) { return run(Engine::create(o), prompts, 24, one_at_a_time); };
    const Outputs want = go(base);
    const Outputs got = go(with_ngram(base, 4));
    EXPECT_EQ(got.tokens, want.tokens) << (one_at_a_time ? "batch 1" : "batched");
    const spec::SpecStats& st = got.stats.spec;
    // Both outcomes must occur, or a verify path (kept drafts, rejected drafts) went untested.
    EXPECT_GT(st.accepted_tokens, 0) << st.draft_tokens << " drafted";
    EXPECT_LT(st.accepted_tokens, st.draft_tokens) << st.drafts << " drafts";
    if (one_at_a_time) {  // batched, the steps depend on when the requests arrive (it once read 30 vs 26)
      EXPECT_LT(got.stats.steps, want.stats.steps);
    }
    std::printf(
        "%s: %lld steps without speculation, %lld with; %lld drafts, %lld of %lld drafted tokens kept "
        "(mean acceptance length %.2f)\n",
        one_at_a_time ? "batch 1" : "batched", (long long)want.stats.steps, (long long)got.stats.steps,
        (long long)st.drafts, (long long)st.accepted_tokens, (long long)st.draft_tokens,
        st.mean_acceptance_length());
  }
}

// The property tests/cuda/test_cuda_verify_graph.cpp checks on CUDA (GreedyNgramLogprobsBitwisePlain), on the
// CPU backend, where every op's row is independent of the batch: greedy with n-gram speculation gives plain
// decoding's tokens, log-probs and top 2, bit for bit, at batch 1 and 4 on a random-weight Qwen3.
TEST(SpecEngine, Qwen3CpuGreedyLogprobsBitwisePlain) {
  EngineOptions base = test::small_opts(8192, 8, 64);
  base.model_dir = write_small_checkpoint();
  base.device = "cpu";
  const auto prompts = repeating_prompts(500, 4, 23);
  for (const bool one_at_a_time : {true, false}) {
    const auto go = [&](const EngineOptions& o, EngineStats* stats) {
      const auto engine = Engine::create(o);
      TokenLogprobs out = collect_logprobs(*engine, prompts, 16, one_at_a_time);
      *stats = engine->stats();
      return out;
    };
    EngineStats plain_stats, spec_stats;
    const TokenLogprobs want = go(base, &plain_stats), got = go(with_ngram(base, 3), &spec_stats);
    EXPECT_GT(spec_stats.spec.accepted_tokens, 0) << "no draft kept: the verify rows went untested";
    EXPECT_EQ(got.tokens, want.tokens) << (one_at_a_time ? "batch 1" : "batch 4");
    EXPECT_EQ(got.logprobs, want.logprobs) << (one_at_a_time ? "batch 1" : "batch 4");
    EXPECT_EQ(got.top, want.top) << (one_at_a_time ? "batch 1" : "batch 4");
  }
}

// The CPU Qwen3Runner taking verify steps as a CUDA verify graph takes them (every row k + 1 positions, short
// rows filled, the batch padded to a power of two): the engine's uniform verify batch through the eager path.
class UniformVerifyRunner : public Qwen3Runner {
 public:
  UniformVerifyRunner(const EngineOptions& o, int32_t rows_per_seq)
      : Qwen3Runner(Qwen3Model::load(o.model_dir, parse_qwen3_runner_settings(o).load), ops::KvLayout::nhd,
                    DType::bf16),
        rows_per_seq_(rows_per_seq) {}
  int32_t verify_graph_bucket(int32_t num_seqs, int32_t rows_per_seq, int32_t, bool tree) const override {
    EXPECT_EQ(rows_per_seq, rows_per_seq_);
    EXPECT_FALSE(tree) << "n-gram drafts are chains";
    ++buckets_given;
    return int32_t(std::bit_ceil(uint32_t(num_seqs)));
  }
  void forward(const BatchDesc& batch, std::vector<float>* logits, std::vector<float>* hidden) override {
    if (is_uniform_verify(batch, rows_per_seq_)) ++uniform_steps;
    Qwen3Runner::forward(batch, logits, hidden);
  }
  using Qwen3Runner::forward_sampled;
  bool forward_sampled(const BatchDesc& batch, const std::vector<RowSampling>& rows, int top_n,
                       std::vector<SampledRow>* out, const std::function<void()>& before_sample) override {
    if (is_uniform_verify(batch, rows_per_seq_)) ++uniform_steps;
    return Qwen3Runner::forward_sampled(batch, rows, top_n, out, before_sample);
  }
  mutable int buckets_given = 0;
  int uniform_steps = 0;  // forward passes given a uniform verify batch

 private:
  int32_t rows_per_seq_;
};

TEST(SpecEngine, UniformVerifyBatchEqualsPlainDecoding) {
  EngineOptions base = test::small_opts(8192, 8, 64);
  base.model_dir = write_small_checkpoint();
  base.device = "cpu";
  const auto prompts = repeating_prompts(500, 5, 21);
  const EngineOptions spec = with_ngram(base, 4);
  for (const bool sampled : {false, true}) {
    // Sampled, seeded: the ragged and the uniform verify batch give the same logits on the CPU, so the same
    // draws; greedy: both equal plain decoding.
    const auto edit = [&](size_t i, Request& r) {
      if (!sampled) return;
      r.sampling.temperature = 0.8f;
      r.sampling.seed = int64_t(100 + i);
    };
    const Outputs want = run(Engine::create(sampled ? spec : base), prompts, 24, false, edit);
    auto runner = std::make_unique<UniformVerifyRunner>(spec, 5);
    const UniformVerifyRunner& r = *runner;
    const Outputs got = run(std::make_unique<Engine>(std::move(runner), spec), prompts, 24, false, edit);
    EXPECT_EQ(got.tokens, want.tokens) << (sampled ? "sampled" : "greedy");
    EXPECT_GT(r.buckets_given, 0);
    EXPECT_GT(got.stats.spec.drafts, 0);
    if (sampled)
      continue;  // a random model's flat distribution rarely keeps a point draft at temperature 0.8
    EXPECT_GT(got.stats.spec.accepted_tokens, 0);
    EXPECT_LT(got.stats.spec.accepted_tokens, got.stats.spec.draft_tokens);
  }
}

// The ragged verify rule (SpecOptions::ragged_verify_factor): with the rule off every verify step the graph
// can run takes its uniform batch; with it always true (any batch size, any drafts) those steps run ragged
// and are counted (a ragged batch whose rows all drafted k can still look uniform, so fewer uniform batches,
// not none); both give plain decoding's greedy tokens.
TEST(SpecEngine, RaggedVerifyRuleChoosesTheBatchAndKeepsOutputs) {
  EngineOptions base = test::small_opts(8192, 8, 64);
  base.model_dir = write_small_checkpoint();
  base.device = "cpu";
  const auto prompts = repeating_prompts(500, 12, 23);
  const Outputs want = run(Engine::create(base), prompts, 24, false);
  int uniform_when_off = 0;
  for (const double factor : {0.0, 1e-6}) {
    EngineOptions spec = with_ngram(base, 4);
    spec.speculative.ragged_verify_factor = factor;
    spec.speculative.ragged_verify_min_seqs = 1;
    auto runner = std::make_unique<UniformVerifyRunner>(spec, 5);
    const UniformVerifyRunner& r = *runner;
    const Outputs got = run(std::make_unique<Engine>(std::move(runner), spec), prompts, 24, false);
    const spec::SpecStats& st = got.stats.spec;
    EXPECT_EQ(got.tokens, want.tokens) << "factor " << factor;
    EXPECT_GT(st.accepted_tokens, 0);
    if (factor == 0.0) {
      EXPECT_EQ(st.ragged_verify_steps, 0);
      EXPECT_GT(r.uniform_steps, 0);
      uniform_when_off = r.uniform_steps;
    } else {
      EXPECT_GT(st.ragged_verify_steps, 0);
      EXPECT_LT(r.uniform_steps, uniform_when_off);
    }
  }
}

}  // namespace
}  // namespace kiln
