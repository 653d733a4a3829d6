// Engine tests on FakeRunner (deterministic logits, paged-context checks on every step): outputs under
// concurrency, chunking, preemption and graph padding equal each request run alone; every request ends
// exactly once and is counted; pages come back.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "kiln/safetensors.h"
#include "model/weights.h"
#include "runtime/engine.h"
#include "runtime/fake_runner.h"
#include "runtime/token_draw.h"

#include <filesystem>
#include <fstream>

namespace kiln {
namespace {

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = (i * 5 + salt * 11) % 60;
  return v;
}

// Collects events per request; waits for finishes.
struct Sink {
  std::mutex mu;
  std::condition_variable cv;
  std::map<RequestId, std::vector<TokenEvent>> events;
  int finished = 0;
  std::function<void(const TokenEvent&)> cb() {
    return [this](const TokenEvent& e) {
      std::lock_guard<std::mutex> lk(mu);
      events[e.id].push_back(e);
      if (e.finished) ++finished;
      cv.notify_all();
    };
  }
  void wait_finished(int n) {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return finished >= n; }))
        << finished << " of " << n;
  }
  std::vector<int32_t> tokens(RequestId id) {
    std::lock_guard<std::mutex> lk(mu);
    std::vector<int32_t> out;
    for (const auto& e : events[id]) out.insert(out.end(), e.ids.begin(), e.ids.end());
    return out;
  }
  TokenEvent last(RequestId id) {
    std::lock_guard<std::mutex> lk(mu);
    return events[id].back();
  }
  void expect_one_finish_each() {
    std::lock_guard<std::mutex> lk(mu);
    for (auto& [id, evs] : events) {
      int n = 0;
      for (auto& e : evs) n += e.finished;
      EXPECT_EQ(n, 1) << "request " << id;
      EXPECT_TRUE(evs.back().finished) << "request " << id << ": events after the finish";
    }
  }
};

EngineOptions small_opts(int64_t tokens, int page_size = 4, int chunk = 16) {
  EngineOptions o;
  o.page_size = page_size;
  o.max_total_tokens = tokens;
  o.chunked_prefill_size = chunk;
  return o;
}

Request greedy(std::vector<int32_t> prompt, int n) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_new_tokens = n;
  return r;
}

void expect_pool_clean(Engine& e) {
  e.flush_cache();
  EngineStats s = e.stats();
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_EQ(s.kv_pages_used, 0);
  EXPECT_EQ(s.kv_pages_cached, 0);
  EXPECT_EQ(s.kv_pages_free, s.kv_pages_total);
}

TEST(Engine, ConcurrentGreedyOutputsEqualEachRequestAlone) {
  for (int variant = 0; variant < 3; ++variant) {
    auto model = std::make_unique<FakeRunner>(64);
    const FakeRunner ref(64);
    FakeRunner* m = model.get();
    if (variant == 2) m->graph_buckets = {1, 2, 4, 8, 16, 32};
    EngineOptions o = small_opts(variant == 1 ? 60 : 4096);  // variant 1: a tiny pool forces preemption
    o.enable_mixed_batches = variant != 2;
    if (variant == 1) o.admission_reserve = 0.0;
    Engine engine(std::move(model), o);
    Sink sink;
    std::vector<std::pair<RequestId, Request>> reqs;
    std::mutex reqs_mu;
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < 8; ++i) {
          Request r = greedy(prompt_of(1 + (t * 8 + i) * 3 % 37, t * 8 + i), 1 + (i * 7) % 20);
          const RequestId id = engine.submit(r, sink.cb());
          std::lock_guard<std::mutex> lk(reqs_mu);
          reqs.emplace_back(id, r);
        }
      });
    for (auto& th : threads) th.join();
    sink.wait_finished(32);
    for (auto& [id, r] : reqs) {
      EXPECT_EQ(sink.tokens(id), ref.reference(r.prompt, r.sampling.max_new_tokens, false))
          << "variant " << variant << " request " << id;
      const TokenEvent last = sink.last(id);
      EXPECT_EQ(last.finish_reason, "length");
      EXPECT_EQ(last.completion_tokens, r.sampling.max_new_tokens);
      EXPECT_EQ(last.prompt_tokens, int(r.prompt.size()));
    }
    sink.expect_one_finish_each();
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.requests_submitted, 32);
    EXPECT_EQ(s.finished_length, 32);
    EXPECT_EQ(s.ttft.count, 32u);
    EXPECT_EQ(s.e2e.count, 32u);
    if (variant == 1) {
      EXPECT_GT(s.preemptions, 0);
    }
    expect_pool_clean(engine);
    engine.shutdown(true);
    if (variant == 2) {
      EXPECT_GT(m->max_seqs_seen, 1);
    }
  }
}

TEST(Engine, DeviceSamplingPathGivesTheSameGreedyOutputs) {
  auto model = std::make_unique<FakeRunner>(64);
  FakeRunner* m = model.get();
  m->device_sampling = true;
  Engine engine(std::move(model), small_opts(4096));
  Sink sink;
  std::vector<std::pair<RequestId, Request>> reqs;
  for (int i = 0; i < 12; ++i) {
    Request r = greedy(prompt_of(3 + i * 4, i), 5 + i);
    if (i == 3) {
      r.sampling.return_logprob = true;
      r.sampling.top_logprobs = 2;
    }
    reqs.emplace_back(engine.submit(r, sink.cb()), r);
  }
  sink.wait_finished(12);
  for (auto& [id, r] : reqs)
    EXPECT_EQ(sink.tokens(id), FakeRunner(64).reference(r.prompt, r.sampling.max_new_tokens, false));
  {
    std::lock_guard<std::mutex> lk(sink.mu);
    const TokenEvent& e = sink.events[reqs[3].first].front();
    ASSERT_EQ(e.logprobs.size(), 1u);
    ASSERT_EQ(e.top_logprobs.size(), 1u);
    ASSERT_EQ(e.top_logprobs[0].size(), 2u);
    EXPECT_EQ(e.top_logprobs[0][0].id, e.ids[0]);
    EXPECT_FLOAT_EQ(e.top_logprobs[0][0].logprob, e.logprobs[0]);
  }
  engine.shutdown(true);
  EXPECT_EQ(m->sampled_steps, m->steps);  // every step sampled on the "device"
}

TEST(Engine, DeviceSamplingFallsBackForMinPAndIsOffWithTheCpuBackend) {
  for (const char* backend : {"auto", "cpu"}) {
    auto model = std::make_unique<FakeRunner>(64);
    FakeRunner* m = model.get();
    m->device_sampling = true;
    EngineOptions o = small_opts(4096);
    o.sampling_backend = backend;
    Engine engine(std::move(model), o);
    Sink sink;
    Request r = greedy(prompt_of(7, 1), 6);
    r.sampling.min_p = 0.05f;  // the device sampler has no min-p
    const RequestId a = engine.submit(r, sink.cb());
    sink.wait_finished(1);
    EXPECT_EQ(sink.tokens(a), FakeRunner(64).reference(r.prompt, 6, false));
    EXPECT_EQ(m->sampled_steps, 0);
    const RequestId b = engine.submit(greedy(prompt_of(7, 2), 4), sink.cb());
    sink.wait_finished(2);
    EXPECT_EQ(sink.tokens(b), FakeRunner(64).reference(prompt_of(7, 2), 4, false));
    engine.shutdown(true);
    EXPECT_EQ(m->sampled_steps, std::string(backend) == "auto" ? 4 : 0) << backend;
  }
  EngineOptions bad = small_opts(4096);
  bad.sampling_backend = "tpu";
  EXPECT_THROW(Engine(std::make_unique<FakeRunner>(64), bad), Error);
}

TEST(Engine, SeededDeviceSamplingIsIndependentOfBatching) {
  Request r;
  r.prompt = prompt_of(12, 4);
  r.sampling.temperature = 1.5f;
  r.sampling.seed = 99;
  r.sampling.max_new_tokens = 30;
  auto run = [&](int others) {
    auto model = std::make_unique<FakeRunner>(64);
    model->device_sampling = true;
    Engine engine(std::move(model), small_opts(4096));
    Sink sink;
    for (int i = 0; i < others; ++i) engine.submit(greedy(prompt_of(30, i), 20), sink.cb());
    const RequestId id = engine.submit(r, sink.cb());
    sink.wait_finished(others + 1);
    return sink.tokens(id);
  };
  const auto alone = run(0);
  EXPECT_EQ(run(5), alone);
  EXPECT_NE(alone, FakeRunner(64).reference(r.prompt, 30, false));
}

TEST(Engine, StopTokenIdsAndEos) {
  const int32_t eos = 7;
  const FakeRunner ref(64, 8, eos);
  // Find a prompt whose greedy continuation hits eos within 40 tokens.
  std::vector<int32_t> p;
  std::vector<int32_t> want;
  for (int salt = 0; salt < 500 && want.empty(); ++salt) {
    auto cand = prompt_of(5, salt);
    auto out = ref.reference(cand, 40, true);
    if (out.back() == eos && out.size() > 1) {
      p = cand;
      want = out;
    }
  }
  ASSERT_FALSE(want.empty());
  Engine engine(std::make_unique<FakeRunner>(64, 8, eos), small_opts(4096));
  Sink sink;
  const RequestId a = engine.submit(greedy(p, 40), sink.cb());
  Request ignore = greedy(p, int(want.size()) + 3);
  ignore.sampling.ignore_eos = true;
  const RequestId b = engine.submit(ignore, sink.cb());
  Request stop_first = greedy(p, 40);
  stop_first.sampling.ignore_eos = true;
  stop_first.sampling.stop_token_ids = {want[0]};
  const RequestId c = engine.submit(stop_first, sink.cb());
  sink.wait_finished(3);
  EXPECT_EQ(sink.tokens(a), want);
  EXPECT_EQ(sink.last(a).finish_reason, "stop");
  EXPECT_EQ(sink.last(a).matched_stop, eos);
  EXPECT_EQ(sink.tokens(b).size(), want.size() + 3);
  EXPECT_EQ(sink.last(b).finish_reason, "length");
  EXPECT_EQ(sink.tokens(c), std::vector<int32_t>{want[0]});
  EXPECT_EQ(sink.last(c).finish_reason, "stop");
  EXPECT_EQ(sink.last(c).matched_stop, want[0]);
}

TEST(Engine, AbortEndsTheRequestAndFreesItsPages) {
  Engine engine(std::make_unique<FakeRunner>(64), small_opts(4096));
  std::promise<RequestId> first_token;
  std::atomic<bool> once{false};
  std::mutex mu;
  std::vector<TokenEvent> evs;
  Engine* eng = &engine;
  const RequestId id = engine.submit(greedy(prompt_of(20, 3), 3000), [&](const TokenEvent& e) {
    {
      std::lock_guard<std::mutex> lk(mu);
      evs.push_back(e);
    }
    if (!once.exchange(true)) eng->abort(e.id);  // abort from inside the callback is allowed
  });
  (void)first_token;
  for (int i = 0; i < 6000; ++i) {
    if (engine.stats().finished_abort == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    ASSERT_FALSE(evs.empty());
    EXPECT_EQ(evs.back().id, id);
    EXPECT_TRUE(evs.back().finished);
    EXPECT_EQ(evs.back().finish_reason, "abort");
    EXPECT_LT(evs.back().completion_tokens, 3000);
  }
  engine.abort(id);     // again: ignored
  engine.abort(99999);  // unknown: ignored
  EXPECT_EQ(engine.stats().finished_abort, 1);
  expect_pool_clean(engine);
}

TEST(Engine, BadInputIsRejectedWithAClearError) {
  Engine engine(std::make_unique<FakeRunner>(64, 8, -1, 100), small_opts(4096));
  Sink sink;
  auto bad = [&](Request r, const char* what) {
    try {
      engine.submit(r, sink.cb());
      ADD_FAILURE() << "accepted: " << what;
    } catch (const EngineBusyError&) {
      ADD_FAILURE() << "busy instead of bad input: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  bad(greedy({}, 3), "empty");
  bad(greedy({1, 64}, 3), "outside the vocabulary");
  bad(greedy({1, -1}, 3), "outside the vocabulary");
  Request r = greedy({1, 2}, 3);
  r.sampling.temperature = std::nanf("");
  bad(r, "temperature");
  r = greedy({1, 2}, 3);
  r.sampling.top_p = 0.0f;
  bad(r, "top_p");
  r = greedy({1, 2}, 3);
  r.sampling.top_k = -5;
  bad(r, "top_k");
  r = greedy({1, 2}, -1);
  bad(r, "max_new_tokens");
  r = greedy({1, 2}, 3);
  r.sampling.stop_token_ids = {64};
  bad(r, "stop token");
  r = greedy({1, 2}, 3);
  r.sampling.top_logprobs = 21;
  bad(r, "top_logprobs");
  bad(greedy(prompt_of(101, 1), 1), "context length");
  bad(greedy(prompt_of(100, 1), 1), "no room");
  EXPECT_EQ(engine.stats().requests_rejected, 11);
  EXPECT_EQ(engine.stats().requests_submitted, 0);
  // A long request is capped by the context limit and ends with "length".
  const RequestId id = engine.submit(greedy(prompt_of(95, 1), 50), sink.cb());
  sink.wait_finished(1);
  EXPECT_EQ(sink.tokens(id).size(), 5u);
  EXPECT_EQ(sink.last(id).finish_reason, "length");
}

// Blocks inside forward() until released, so the test controls what the engine thread is doing.
class GateRunner : public FakeRunner {
 public:
  std::promise<void> entered;
  std::shared_future<void> release;
  bool first = true;
  void forward(const BatchDesc& b, std::vector<float>* l, std::vector<float>* h) override {
    if (first) {
      first = false;
      entered.set_value();
      release.wait();
    }
    FakeRunner::forward(b, l, h);
  }
};

TEST(Engine, FullQueueAndShutdownAreBusyErrors) {
  auto gate = std::make_unique<GateRunner>();
  std::promise<void> open;
  gate->release = open.get_future().share();
  auto entered = gate->entered.get_future();
  EngineOptions o = small_opts(4096);
  o.max_queued_requests = 1;
  Engine engine(std::move(gate), o);
  Sink sink;
  engine.submit(greedy({1, 2, 3}, 2), sink.cb());
  entered.wait();                                  // the engine thread holds request 1 in forward()
  engine.submit(greedy({1, 2, 3}, 2), sink.cb());  // queued
  EXPECT_THROW(engine.submit(greedy({1, 2, 3}, 2), sink.cb()), EngineBusyError);
  open.set_value();
  sink.wait_finished(2);
  engine.shutdown(true);
  EXPECT_THROW(engine.submit(greedy({1, 2, 3}, 2), sink.cb()), EngineBusyError);
  EXPECT_EQ(engine.stats().requests_rejected, 2);
  EXPECT_EQ(engine.stats().finished_length, 2);
}

TEST(Engine, ForwardFailureEndsThoseRequestsInErrorAndTheEngineGoesOn) {
  auto model = std::make_unique<FakeRunner>(64);
  model->fail_at_step = 0;
  Engine engine(std::move(model), small_opts(4096));
  Sink sink;
  const RequestId a = engine.submit(greedy(prompt_of(9, 1), 4), sink.cb());
  sink.wait_finished(1);
  EXPECT_EQ(sink.last(a).finish_reason, "error");
  EXPECT_NE(sink.last(a).error.find("injected failure"), std::string::npos);
  const RequestId b = engine.submit(greedy(prompt_of(9, 1), 4), sink.cb());
  sink.wait_finished(2);
  EXPECT_EQ(sink.tokens(b), FakeRunner(64).reference(prompt_of(9, 1), 4, false));
  EXPECT_EQ(engine.stats().finished_error, 1);
  expect_pool_clean(engine);
}

TEST(Engine, SeededSamplingIsIndependentOfBatching) {
  Request r;
  r.prompt = prompt_of(12, 4);
  r.sampling.temperature = 1.5f;
  r.sampling.top_k = 20;
  r.sampling.seed = 1234;
  r.sampling.max_new_tokens = 30;
  std::vector<int32_t> alone;
  {
    Engine engine(std::make_unique<FakeRunner>(64), small_opts(4096));
    Sink sink;
    const RequestId id = engine.submit(r, sink.cb());
    sink.wait_finished(1);
    alone = sink.tokens(id);
  }
  Engine engine(std::make_unique<FakeRunner>(64), small_opts(4096));
  Sink sink;
  for (int i = 0; i < 5; ++i) engine.submit(greedy(prompt_of(30, i), 20), sink.cb());
  const RequestId id = engine.submit(r, sink.cb());
  sink.wait_finished(6);
  EXPECT_EQ(sink.tokens(id), alone);
  EXPECT_NE(alone, FakeRunner(64).reference(r.prompt, 30, false));  // it did sample
}

TEST(Engine, LogprobsAndTopAlternatives) {
  Engine engine(std::make_unique<FakeRunner>(64), small_opts(4096));
  Sink sink;
  Request r = greedy(prompt_of(6, 2), 5);
  r.sampling.return_logprob = true;
  r.sampling.top_logprobs = 3;
  const RequestId id = engine.submit(r, sink.cb());
  sink.wait_finished(1);
  std::lock_guard<std::mutex> lk(sink.mu);
  int n = 0;
  for (const TokenEvent& e : sink.events[id]) {
    for (size_t i = 0; i < e.ids.size(); ++i, ++n) {
      ASSERT_EQ(e.logprobs.size(), e.ids.size());
      ASSERT_EQ(e.top_logprobs.size(), e.ids.size());
      ASSERT_EQ(e.top_logprobs[i].size(), 3u);
      EXPECT_EQ(e.top_logprobs[i][0].id, e.ids[i]);  // greedy picks the most likely token
      EXPECT_FLOAT_EQ(e.top_logprobs[i][0].logprob, e.logprobs[i]);
      EXPECT_LT(e.logprobs[i], 0.0f);
      EXPECT_GE(e.top_logprobs[i][0].logprob, e.top_logprobs[i][1].logprob);
      // FakeRunner's peak is 2.0 and every other logit < 1: logprob of the peak is known in closed form.
      EXPECT_GT(e.logprobs[i], -std::log(1.0f + 63.0f * std::exp(-1.0f)) - 1e-4f);
    }
  }
  EXPECT_EQ(n, 5);
}

TEST(Engine, EmbeddingsAndHiddenStates) {
  Engine engine(std::make_unique<FakeRunner>(64, 16), small_opts(4096));
  Sink sink;
  Request e;
  e.prompt = prompt_of(10, 1);
  e.embedding = true;
  const RequestId a = engine.submit(e, sink.cb());
  Request h = greedy(prompt_of(10, 1), 0);
  h.return_hidden = true;
  const RequestId b = engine.submit(h, sink.cb());
  sink.wait_finished(2);
  const TokenEvent ea = sink.last(a), eb = sink.last(b);
  ASSERT_EQ(ea.embedding.size(), 16u);
  double ss = 0;
  for (float x : ea.embedding) ss += double(x) * x;
  EXPECT_NEAR(ss, 1.0, 1e-5);
  EXPECT_TRUE(ea.ids.empty());
  ASSERT_EQ(eb.hidden.size(), 16u);
  EXPECT_TRUE(eb.ids.empty());
  EXPECT_EQ(eb.finish_reason, "length");
  // Same prompt, same last position: the embedding is the normalised hidden state.
  double hs = 0;
  for (float x : eb.hidden) hs += double(x) * x;
  EXPECT_NEAR(ea.embedding[3], eb.hidden[3] / std::sqrt(hs), 1e-6);
}

TEST(Engine, ShutdownWithoutDrainAbortsEverythingAndCountsIt) {
  Sink sink;
  {
    Engine engine(std::make_unique<FakeRunner>(64), small_opts(4096));
    for (int i = 0; i < 10; ++i) engine.submit(greedy(prompt_of(10, i), 5000), sink.cb());
    engine.shutdown(false);
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.finished_abort + s.finished_length, 10);
    EXPECT_GT(s.finished_abort, 0);
  }
  EXPECT_EQ(sink.finished, 10);
  sink.expect_one_finish_each();
}

TEST(Engine, ShutdownWithDrainFinishesEverything) {
  Sink sink;
  Engine engine(std::make_unique<FakeRunner>(64), small_opts(4096));
  for (int i = 0; i < 10; ++i) engine.submit(greedy(prompt_of(10, i), 20), sink.cb());
  engine.shutdown(true);
  EXPECT_EQ(sink.finished, 10);
  EXPECT_EQ(engine.stats().finished_length, 10);
  EXPECT_EQ(engine.stats().generation_tokens_total, 200);
}

TEST(Engine, CachedTokensAreReported) {
  Engine engine(std::make_unique<FakeRunner>(64), small_opts(4096));
  Sink sink;
  const auto p = prompt_of(23, 5);
  const RequestId a = engine.submit(greedy(p, 2), sink.cb());
  sink.wait_finished(1);
  const RequestId b = engine.submit(greedy(p, 2), sink.cb());
  sink.wait_finished(2);
  EXPECT_EQ(sink.last(a).cached_tokens, 0);
  EXPECT_EQ(sink.last(b).cached_tokens, 20);  // 5 full pages of 4; the last token is always computed
  EXPECT_EQ(sink.tokens(a), sink.tokens(b));
  EXPECT_EQ(engine.stats().cached_tokens_total, 20);
  // At rest (no flush): no page is used, the 6 full pages of prompt + output stay cached.
  EngineStats s;
  for (int i = 0; i < 1000; ++i) {
    s = engine.stats();
    if (s.kv_pages_used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(s.kv_pages_used, 0);
  EXPECT_EQ(s.kv_pages_cached, 6);
  EXPECT_EQ(s.kv_pages_free, s.kv_pages_total - 6);
}

// ---- draw_token: the CPU token choice.

TEST(TokenDraw, GreedyTopKOneAndFilters) {
  const std::vector<float> logits{0.5f, 2.0f, 1.0f, 2.0f, -1.0f};  // ties at ids 1 and 3
  std::mt19937_64 rng(1);
  SamplingParams g;
  g.temperature = 0.0f;
  EXPECT_EQ(draw_token(logits.data(), 5, g, rng).token, 1);  // lowest id on ties
  SamplingParams k1;
  k1.top_k = 1;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(draw_token(logits.data(), 5, k1, rng).token, 1);
  SamplingParams tp;  // top-p 0.5: the two tied leaders hold ~0.71 together, one alone ~0.36 < 0.5
  tp.top_p = 0.5f;
  std::map<int32_t, int> seen;
  for (int i = 0; i < 400; ++i) ++seen[draw_token(logits.data(), 5, tp, rng).token];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], 120);
  EXPECT_GT(seen[3], 120);
  SamplingParams mp;  // min-p 0.5 keeps ids with p >= 0.5 * p_max: 1, 3 (2 has e^-1 ~ 0.37 of the max)
  mp.min_p = 0.5f;
  seen.clear();
  for (int i = 0; i < 400; ++i) ++seen[draw_token(logits.data(), 5, mp, rng).token];
  EXPECT_EQ(seen.size(), 2u);
}

TEST(TokenDraw, GreedyArgmaxOnOddSizesTiesAndNaN) {
  std::mt19937_64 rng(1);
  SamplingParams g;
  g.temperature = 0.0f;
  for (int n : {1, 7, 8, 9, 17, 1000, 151936}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) x[size_t(i)] = float((i * 37) % 101) * 0.01f;
    x[size_t(n - 1)] = 5.0f;  // the maximum in the tail that the 8-wide loop leaves over
    EXPECT_EQ(draw_token(x.data(), n, g, rng).token, n - 1) << n;
    if (n > 3) {
      x[2] = 5.0f;  // a tie: the lowest id wins
      EXPECT_EQ(draw_token(x.data(), n, g, rng).token, 2) << n;
      x[1] = std::nanf("");  // NaN never wins
      EXPECT_EQ(draw_token(x.data(), n, g, rng).token, 2) << n;
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> y{-inf, -inf, 1.0f, inf, 3.0f};
  EXPECT_EQ(draw_token(y.data(), 5, g, rng).token, 3);
}

TEST(TokenDraw, FrequenciesFollowTheSoftmax) {
  const std::vector<float> logits{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};  // p = k / 10
  std::mt19937_64 rng(42);
  SamplingParams p;
  std::vector<int> n(4, 0);
  const int N = 20000;
  for (int i = 0; i < N; ++i) ++n[size_t(draw_token(logits.data(), 4, p, rng).token)];
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(double(n[size_t(k)]) / N, (k + 1) / 10.0, 0.015) << k;
  // Temperature 2 flattens: p ~ sqrt(k + 1) / sum.
  p.temperature = 2.0f;
  std::fill(n.begin(), n.end(), 0);
  double z = 0;
  for (int k = 0; k < 4; ++k) z += std::sqrt(k + 1.0);
  for (int i = 0; i < N; ++i) ++n[size_t(draw_token(logits.data(), 4, p, rng).token)];
  for (int k = 0; k < 4; ++k) EXPECT_NEAR(double(n[size_t(k)]) / N, std::sqrt(k + 1.0) / z, 0.015) << k;
}

TEST(TokenDraw, LogprobsAreOfTheRawLogits) {
  const std::vector<float> logits{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  std::mt19937_64 rng(3);
  SamplingParams p;
  p.temperature = 0.0f;
  p.return_logprob = true;
  p.top_logprobs = 2;
  const Draw d = draw_token(logits.data(), 4, p, rng);
  EXPECT_EQ(d.token, 3);
  EXPECT_NEAR(d.logprob, std::log(0.4), 1e-6);
  ASSERT_EQ(d.top.size(), 2u);
  EXPECT_EQ(d.top[1].id, 2);
  EXPECT_NEAR(d.top[1].logprob, std::log(0.3), 1e-6);
}

// ---- The real model: a demo-shaped checkpoint (what `kiln demo-model` writes: Qwen3 vocabulary, 4 layers,
// hidden 256, GQA 8:2, head_dim 64, tied embeddings, seeded random bf16 weights), loaded by Engine::create.

const char* kDemoConfig = R"({
  "architectures": ["Qwen3ForCausalLM"], "bos_token_id": 151643, "dtype": "bfloat16",
  "eos_token_id": [151645, 151643], "head_dim": 64, "hidden_act": "silu", "hidden_size": 256,
  "intermediate_size": 768, "max_position_embeddings": 40960, "model_type": "qwen3",
  "num_attention_heads": 8, "num_hidden_layers": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "tie_word_embeddings": true,
  "vocab_size": 151936})";

std::string write_demo_checkpoint() {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(KILN_BINARY_DIR) / "test_engine_demo_ckpt";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << kDemoConfig;
  const ModelConfig cfg = parse_model_config(kDemoConfig, "demo config");
  std::vector<std::vector<bf16_t>> data;
  std::vector<NamedTensor> tensors;
  const auto specs = qwen3_weight_specs(cfg);
  data.reserve(specs.size());
  for (const WeightSpec& w : specs) {
    int64_t n = 1;
    for (int64_t d : w.shape) n *= d;
    data.emplace_back(static_cast<size_t>(n));
    fill_random_weight(w, 0, data.back().data());
    Tensor t(data.back().data(), DType::bf16, {n});
    t.ndim = int(w.shape.size());
    int64_t stride = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      t.shape[size_t(i)] = w.shape[size_t(i)];
      t.stride[size_t(i)] = stride;
      stride *= w.shape[size_t(i)];
    }
    tensors.push_back({w.name, t});
  }
  write_safetensors((dir / "model.safetensors").string(), tensors, {{"format", "pt"}});
  return dir.string();
}

std::vector<std::vector<int32_t>> run_all(const EngineOptions& o,
                                          const std::vector<std::vector<int32_t>>& prompts, int new_tokens,
                                          bool one_at_a_time, EngineStats* stats) {
  auto engine = Engine::create(o);
  Sink sink;
  std::vector<RequestId> ids;
  for (const auto& p : prompts) {
    ids.push_back(engine->submit(greedy(p, new_tokens), sink.cb()));
    if (one_at_a_time) sink.wait_finished(int(ids.size()));
  }
  sink.wait_finished(int(prompts.size()));
  std::vector<std::vector<int32_t>> out;
  for (RequestId id : ids) {
    out.push_back(sink.tokens(id));
    EXPECT_EQ(sink.last(id).finish_reason == "length" || sink.last(id).finish_reason == "stop", true);
  }
  expect_pool_clean(*engine);
  if (stats) *stats = engine->stats();
  return out;
}

TEST(EngineQwen3, MixedBatchGreedyEqualsEachRequestAlone) {
  EngineOptions base;
  base.model_dir = write_demo_checkpoint();
  base.device = "cpu";
  base.page_size = 16;
  base.max_total_tokens = 4096;
  std::vector<std::vector<int32_t>> prompts;
  uint32_t rng = 7;
  for (int n : {5, 17, 33, 48, 64, 3, 31}) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(int32_t((rng = rng * 1664525u + 1013904223u) >> 8) % 151000);
    prompts.push_back(p);
  }
  prompts.push_back(prompts[3]);  // a repeat: served from the prefix cache in the batched runs
  prompts.back().push_back(42);

  EngineOptions alone = base;  // whole prompts, no mixing, no prefix cache, one request at a time
  alone.chunked_prefill_size = 0;
  alone.enable_mixed_batches = false;
  alone.enable_prefix_cache = false;
  const auto want = run_all(alone, prompts, 8, true, nullptr);

  EngineOptions mixed = base;  // 16-token chunks riding with decode rows, prefix cache on
  mixed.chunked_prefill_size = 16;
  EngineStats s;
  EXPECT_EQ(run_all(mixed, prompts, 8, false, &s), want);
  EXPECT_GT(s.cached_tokens_total, 0);

  EngineOptions tiny = mixed;  // 20 pages of 4 tokens: requests are preempted and recomputed
  tiny.page_size = 4;
  tiny.max_total_tokens = 80;
  tiny.admission_reserve = 0.0;
  EXPECT_EQ(run_all(tiny, prompts, 8, false, &s), want);
  EXPECT_GT(s.preemptions, 0);

  EngineOptions hnd = mixed;
  hnd.kv_layout = "hnd";
  EXPECT_EQ(run_all(hnd, prompts, 8, false, nullptr), want);
}

TEST(EngineQwen3, CreateRejectsBadOptions) {
  EngineOptions o;
  EXPECT_THROW(Engine::create(o), Error);  // no model
  o.model_dir = write_demo_checkpoint();
  o.device = "tpu";
  EXPECT_THROW(Engine::create(o), Error);
  o.device = "cpu";
  o.kv_layout = "xyz";
  EXPECT_THROW(Engine::create(o), Error);
  o.kv_layout = "nhd";
  o.load_format = "pickle";
  EXPECT_THROW(Engine::create(o), Error);
  o.load_format = "auto";
  o.kv_cache_dtype = "int3";
  EXPECT_THROW(Engine::create(o), Error);
  o.kv_cache_dtype = "auto";
  o.max_total_tokens = 4096;
  auto engine = Engine::create(o);
  EXPECT_EQ(engine->model_config().vocab_size, 151936);
  EXPECT_EQ(engine->stats().kv_pages_total, 4096 / 32);
}

}  // namespace
}  // namespace kiln
