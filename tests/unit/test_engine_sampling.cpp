// The engine's logit processing and parallel samples over the FakeRunner, on the host sampler and on the
// fake "device" sampler (forward_sampled): outputs equal a step-by-step reference that applies the
// request's LogitProcessor to the fake model's logits; logit_bias forces tokens; min_new_tokens holds
// back stop ids and EOS; n samples of one prompt prefill it once (the others reuse its cached pages).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "engine_test_util.h"
#include "runtime/engine.h"
#include "runtime/fake_runner.h"
#include "runtime/logit_processor.h"

namespace kiln {
namespace {

using test::expect_pool_clean;
using test::greedy;
using test::prompt_of;
using test::Sink;
using test::small_opts;

constexpr int64_t kVocab = 64;

// Greedy continuation of `r` with its logit processing, one token at a time (no batching or cache).
std::vector<int32_t> processed_reference(const FakeRunner& m, const Request& r) {
  std::vector<int32_t> masked = r.sampling.stop_token_ids;
  if (!r.sampling.ignore_eos)
    masked.insert(masked.end(), m.config().eos_token_ids.begin(), m.config().eos_token_ids.end());
  LogitProcessor proc(r.sampling, r.prompt, masked);
  std::vector<int32_t> ctx = r.prompt, out;
  std::vector<float> row(static_cast<size_t>(kVocab));
  for (int i = 0; i < r.sampling.max_new_tokens; ++i) {
    m.write_logits(ctx.data(), int64_t(ctx.size()), row.data());
    proc.apply(row.data(), kVocab);
    const int32_t t = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    out.push_back(t);
    ctx.push_back(t);
    proc.observe(t);
    if (std::find(masked.begin(), masked.end(), t) != masked.end()) break;
  }
  return out;
}

std::unique_ptr<Engine> make_engine(bool device, FakeRunner** out = nullptr, int32_t eos = -1) {
  auto model = std::make_unique<FakeRunner>(kVocab, 8, eos);
  model->device_sampling = device;
  if (out) *out = model.get();
  return std::make_unique<Engine>(std::move(model), small_opts(4096));
}

TEST(EngineSampling, PenaltiesFollowTheReferenceOnBothSamplers) {
  for (bool device : {false, true}) {
    FakeRunner* m = nullptr;
    auto engine = make_engine(device, &m, /*eos=*/5);
    const FakeRunner ref(kVocab, 8, 5);
    Sink sink;
    std::vector<std::pair<RequestId, Request>> reqs;
    for (int i = 0; i < 8; ++i) {
      Request r = greedy(prompt_of(6 + 3 * i, i), 24);
      r.sampling.presence_penalty = i % 2 ? 1.5f : 0.0f;
      r.sampling.frequency_penalty = i % 3 ? 0.4f : -0.3f;
      r.sampling.repetition_penalty = i % 4 == 0 ? 1.0f : 2.0f;
      if (i == 5) r.sampling.logit_bias = {{9, 0.9f}, {10, -0.5f}};
      reqs.emplace_back(engine->submit(r, sink.cb()), r);
    }
    sink.wait_finished(8);
    int changed = 0;  // the penalties did something: the fake model's plain greedy path differs
    for (auto& [id, r] : reqs) {
      const auto want = processed_reference(ref, r);
      EXPECT_EQ(sink.tokens(id), want) << "device " << device << " request " << id;
      changed += want != ref.reference(r.prompt, r.sampling.max_new_tokens, true);
    }
    EXPECT_GE(changed, 4);
    // A huge repetition penalty with a presence penalty: no generated token repeats (the fake model's
    // other logits are in [0, 1), its peak 2, so a seen id falls below the unseen ones).
    Request r = greedy(prompt_of(4, 3), 40);
    r.sampling.repetition_penalty = 2.0f;
    r.sampling.presence_penalty = 2.0f;
    r.sampling.ignore_eos = true;
    const RequestId id = engine->submit(r, sink.cb());
    sink.wait_finished(9);
    auto toks = sink.tokens(id);
    ASSERT_EQ(toks.size(), 40u);
    std::sort(toks.begin(), toks.end());
    EXPECT_EQ(std::adjacent_find(toks.begin(), toks.end()), toks.end()) << "a token repeated";
    expect_pool_clean(*engine);
    engine->shutdown(true);
    if (device) {
      EXPECT_EQ(m->sampled_steps, m->logit_steps);  // all of it on the "device" path
    }
  }
}

TEST(EngineSampling, LogitBiasForcesATokenAndLogprobsAreOfTheProcessedDistribution) {
  for (bool device : {false, true}) {
    auto engine = make_engine(device);
    Sink sink;
    Request r;
    r.prompt = prompt_of(9, 2);
    r.sampling.temperature = 1.0f;  // sampled, not greedy: the bias still wins
    r.sampling.seed = 3;
    r.sampling.max_new_tokens = 12;
    r.sampling.logit_bias = {{17, 100.0f}};
    r.sampling.return_logprob = true;
    r.sampling.top_logprobs = 2;
    const RequestId id = engine->submit(r, sink.cb());
    sink.wait_finished(1);
    EXPECT_EQ(sink.tokens(id), std::vector<int32_t>(12, 17)) << "device " << device;
    std::lock_guard<std::mutex> lk(sink.mu);
    for (const TokenEvent& e : sink.events[id]) {
      for (float lp : e.logprobs) EXPECT_NEAR(lp, 0.0f, 1e-4) << "device " << device;
      for (const auto& top : e.top_logprobs) {
        ASSERT_EQ(top.size(), 2u);
        EXPECT_EQ(top[0].id, 17);
        EXPECT_LT(top[1].logprob, -90.0f);
      }
    }
  }
}

TEST(EngineSampling, MinNewTokensHoldsBackStopIdsAndEos) {
  for (bool device : {false, true}) {
    auto engine = make_engine(device, nullptr, /*eos=*/11);
    Sink sink;
    // EOS is what the bias pushes: it ends the request right after min_new_tokens.
    Request r = greedy(prompt_of(7, 1), 20);
    r.sampling.logit_bias = {{11, 50.0f}};
    r.sampling.min_new_tokens = 5;
    const RequestId a = engine->submit(r, sink.cb());
    // A stop id instead, with ignore_eos: EOS is not masked then, nor does it stop.
    Request s = greedy(prompt_of(7, 1), 20);
    s.sampling.logit_bias = {{11, 50.0f}, {12, 60.0f}};
    s.sampling.stop_token_ids = {12};
    s.sampling.ignore_eos = true;
    s.sampling.min_new_tokens = 3;
    const RequestId b = engine->submit(s, sink.cb());
    sink.wait_finished(2);
    const auto ta = sink.tokens(a), tb = sink.tokens(b);
    ASSERT_EQ(ta.size(), 6u) << "device " << device;
    EXPECT_EQ(std::count(ta.begin(), ta.end(), 11), 1);
    EXPECT_EQ(ta.back(), 11);
    EXPECT_EQ(sink.last(a).finish_reason, "stop");
    EXPECT_EQ(sink.last(a).matched_stop, 11);
    EXPECT_EQ(tb, (std::vector<int32_t>{11, 11, 11, 12}));
    EXPECT_EQ(sink.last(b).matched_stop, 12);
  }
}

TEST(EngineSampling, ParallelSamplesPrefillTheirPromptOnce) {
  for (bool device : {false, true}) {
    FakeRunner* m = nullptr;
    auto engine = make_engine(device, &m);
    Sink sink;
    const std::vector<int32_t> prompt = prompt_of(41, 6);  // page size 4: 10 full pages, then a tail
    std::vector<RequestId> ids;
    for (int i = 0; i < 4; ++i) {
      Request r;
      r.prompt = prompt;
      r.sampling.temperature = 1.0f;
      r.sampling.seed = 100 + i;
      r.sampling.max_new_tokens = 6;
      r.after_prefill_of = i == 0 ? 0 : ids[0];
      ids.push_back(engine->submit(r, sink.cb()));
    }
    sink.wait_finished(4);
    std::vector<std::vector<int32_t>> outs;
    for (RequestId id : ids) outs.push_back(sink.tokens(id));
    std::sort(outs.begin(), outs.end());
    EXPECT_EQ(std::unique(outs.begin(), outs.end()), outs.end()) << "the 4 seeded samples are not distinct";
    // The first computes the whole prompt; the others find its 10 full pages cached and compute the last
    // token only (41 = 40 cached + 1).
    EXPECT_EQ(sink.last(ids[0]).cached_tokens, 0);
    for (int i = 1; i < 4; ++i) EXPECT_EQ(sink.last(ids[size_t(i)]).cached_tokens, 40) << i;
    const EngineStats st = engine->stats();
    EXPECT_EQ(st.cached_tokens_total, 120);
    EXPECT_EQ(st.prompt_tokens_total, 4 * 41);
    const int64_t computed = std::accumulate(m->step_tokens.begin(), m->step_tokens.end(), int64_t(0));
    EXPECT_EQ(computed, 41 + 3 * 1 + 4 * 5) << "prompt once, three last tokens, five decode steps each";
    expect_pool_clean(*engine);
  }
}

TEST(EngineSampling, AHeldSampleCanBeAbortedAndFollowsAnAbortedLeader) {
  auto engine = make_engine(false);
  Sink sink;
  Request lead = greedy(prompt_of(200, 1), 4);
  const RequestId a = engine->submit(lead, sink.cb());
  Request f = lead;
  f.after_prefill_of = a;
  Request fb = f;
  fb.sampling.max_new_tokens =
      2000;  // b cannot finish on its own before the abort below, however slow we are
  const RequestId b = engine->submit(fb, sink.cb());
  const RequestId c = engine->submit(f, sink.cb());
  engine->abort(b);  // held or not by now: it ends once, as an abort
  engine->abort(a);  // c is then admitted on its own
  sink.wait_finished(3);
  sink.expect_one_finish_each();
  EXPECT_EQ(sink.last(b).finish_reason, "abort");
  EXPECT_EQ(sink.last(c).finish_reason, "length");
  EXPECT_EQ(sink.tokens(c), FakeRunner(kVocab).reference(lead.prompt, 4, false));
  EXPECT_EQ(engine->stats().waiting, 0);
  expect_pool_clean(*engine);
}

}  // namespace
}  // namespace kiln
