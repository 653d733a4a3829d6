// The overlap schedule (EngineOptions::overlap_schedule) over FakeRunner, whose launch_sampled runs a
// chained step on the previous launch's draws as a device would, and which checks every context it reads
// back through the page table: the outputs equal those of one step at a time (greedy: the reference;
// seeded sampling: the same draws), with requests stopping on EOS while a step is in flight, requests waiting
// for a place, aborts and arrivals mid-run, a failing step, and rows that cannot go ahead (logit processing,
// min_p).
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "engine_test_util.h"
#include "runtime/fake_runner.h"

namespace kiln {
namespace {

using test::expect_pool_clean;
using test::greedy;
using test::prompt_of;
using test::Sink;
using test::small_opts;

constexpr int32_t kEos = 7;

struct Outputs {
  std::map<int, std::vector<int32_t>> tokens;  // by request index
  std::map<int, std::string> reasons;
  int64_t launched = 0, chained = 0;
};

// requests[i] submitted at once; overlap on or off; graph buckets so decode steps are graphable;
// max_running: the engine's cap on running requests (the rest wait).
Outputs run(const std::vector<Request>& requests, bool overlap, int max_running = 256) {
  auto model = std::make_unique<FakeRunner>(64, 8, kEos);
  FakeRunner* m = model.get();
  m->device_sampling = true;
  m->launch_ahead = true;
  m->graph_buckets = {1, 2, 4, 8, 16};
  EngineOptions o = small_opts(4096);
  o.overlap_schedule = overlap;
  o.max_running_requests = max_running;
  Engine engine(std::move(model), o);
  Sink sink;
  std::vector<RequestId> ids;
  for (const Request& r : requests) ids.push_back(engine.submit(r, sink.cb()));
  sink.wait_finished(int(requests.size()));
  sink.expect_one_finish_each();
  Outputs out;
  for (size_t i = 0; i < ids.size(); ++i) {
    out.tokens[int(i)] = sink.tokens(ids[i]);
    out.reasons[int(i)] = sink.last(ids[i]).finish_reason;
  }
  expect_pool_clean(engine);
  engine.shutdown(true);
  out.launched = m->launched_steps;
  out.chained = m->chained_steps;
  return out;
}

TEST(EngineOverlap, SameOutputsAsOneStepAtATime) {
  std::vector<Request> reqs;
  for (int i = 0; i < 10; ++i) {
    Request r = greedy(prompt_of(3 + i * 5, i), 6 + 3 * i);
    r.sampling.ignore_eos = i % 3 == 0;  // the others stop at EOS when they draw it
    if (i % 4 == 1) {                    // seeded sampling: the step index keeps the draws
      r.sampling.temperature = 1.3f;
      r.sampling.seed = 1000 + uint64_t(i);
    }
    if (i == 2) {
      r.sampling.return_logprob = true;
      r.sampling.top_logprobs = 3;
    }
    reqs.push_back(r);
  }
  const Outputs off = run(reqs, false), on = run(reqs, true);
  EXPECT_EQ(off.launched, 0);
  EXPECT_GT(on.chained, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(on.tokens.at(int(i)), off.tokens.at(int(i))) << "request " << i;
    EXPECT_EQ(on.reasons.at(int(i)), off.reasons.at(int(i))) << "request " << i;
  }
  // Greedy ones: FakeRunner's reference (EOS ends those not ignoring it).
  const FakeRunner ref(64, 8, kEos);
  int stopped = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i].sampling.temperature > 0.0f) continue;
    const bool eos = !reqs[i].sampling.ignore_eos;
    EXPECT_EQ(on.tokens.at(int(i)), ref.reference(reqs[i].prompt, reqs[i].sampling.max_new_tokens, eos))
        << "request " << i;
    stopped += on.reasons.at(int(i)) == "stop";
  }
  EXPECT_GT(stopped, 0) << "no request stopped at EOS while a step was in flight: the case is untested";
}

// Requests waiting while every running place is taken (a saturated server) do not stop the overlap: none can
// be admitted before a running one ends. Two places, six requests: the decode steps of all three pairs go
// ahead (one step at a time whenever something waited, only the last pair's could), and each waiting request
// is admitted once a place frees, with the same outputs.
TEST(EngineOverlap, WaitingRequestsThatCannotBeAdmittedDoNotStopIt) {
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) {
    Request r = greedy(prompt_of(5 + i, 60 + i), 24);
    r.sampling.ignore_eos = i % 2 == 0;  // the others may stop early at EOS, freeing their place sooner
    reqs.push_back(r);
  }
  const Outputs off = run(reqs, false, 2), on = run(reqs, true, 2);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(on.tokens.at(int(i)), off.tokens.at(int(i))) << "request " << i;
    EXPECT_EQ(on.reasons.at(int(i)), off.reasons.at(int(i))) << "request " << i;
  }
  // One pair's decode chain is at most 21 steps (24 tokens, the first from the prefill, the last two not
  // ahead).
  EXPECT_GT(on.chained, 30) << "the steps of the pairs that ran while others waited did not go ahead";
}

TEST(EngineOverlap, AbortsArrivalsAndAFailingStep) {
  auto model = std::make_unique<FakeRunner>(64, 8, -1);
  FakeRunner* m = model.get();
  m->device_sampling = true;
  m->launch_ahead = true;
  m->graph_buckets = {1, 2, 4, 8};
  EngineOptions o = small_opts(2048);
  o.overlap_schedule = true;
  Engine engine(std::move(model), o);
  Sink sink;
  std::map<RequestId, Request> reqs;
  for (int i = 0; i < 6; ++i) {
    const Request r = greedy(prompt_of(4 + i, i), 40);
    reqs[engine.submit(r, sink.cb())] = r;
  }
  // Mid-run (60 tokens out, decode steps going ahead of their predecessors): two aborts, four arrivals.
  const auto emitted = [&] {
    std::lock_guard<std::mutex> lk(sink.mu);
    size_t n = 0;
    for (const auto& [id, evs] : sink.events) n += evs.size();
    return n;
  };
  while (emitted() < 60) std::this_thread::sleep_for(std::chrono::microseconds(50));
  const RequestId first = reqs.begin()->first;
  engine.abort(first);
  engine.abort(std::next(reqs.begin())->first);
  for (int i = 0; i < 4; ++i) {
    const Request r = greedy(prompt_of(9 + i, 20 + i), 12);
    reqs[engine.submit(r, sink.cb())] = r;
  }
  sink.wait_finished(int(reqs.size()));
  sink.expect_one_finish_each();
  EXPECT_GT(m->chained_steps, 20);
  const FakeRunner ref(64);
  for (auto& [id, r] : reqs) {
    const TokenEvent last = sink.last(id);
    const std::vector<int32_t> full = ref.reference(r.prompt, r.sampling.max_new_tokens, false);
    const std::vector<int32_t> got = sink.tokens(id);
    if (last.finish_reason == "abort") {
      ASSERT_LE(got.size(), full.size());
      EXPECT_EQ(got, std::vector<int32_t>(full.begin(), full.begin() + ptrdiff_t(got.size())));
    } else {
      EXPECT_EQ(last.finish_reason, "length") << "request " << id;
      EXPECT_EQ(got, full) << "request " << id;
    }
  }
  expect_pool_clean(engine);
  // A step that fails while another is in flight: its requests end in error, the engine goes on. The gate
  // holds the engine's first step until all three are submitted, so all three are running by the second
  // step and still running (30 tokens each) when the seventh fails, whatever the thread scheduling (without
  // it, a test thread descheduled between two submits let the first request reach the failing step alone).
  m->fail_at_step = m->steps + 6;
  const int64_t chained_before = m->chained_steps;
  m->hold_steps();
  std::vector<RequestId> late;
  for (int i = 0; i < 3; ++i) late.push_back(engine.submit(greedy(prompt_of(5, 40 + i), 30), sink.cb()));
  m->release_steps();
  sink.wait_finished(int(reqs.size()) + 3);
  int errors = 0;
  for (RequestId id : late) errors += sink.last(id).finish_reason == "error";
  EXPECT_EQ(errors, 3);
  EXPECT_GT(m->chained_steps, chained_before);  // steps went ahead of their predecessors meanwhile
  const RequestId after = engine.submit(greedy(prompt_of(6, 50), 10), sink.cb());
  sink.wait_finished(int(reqs.size()) + 4);
  EXPECT_EQ(sink.tokens(after), ref.reference(prompt_of(6, 50), 10, false));
  expect_pool_clean(engine);
  engine.shutdown(true);
}

TEST(EngineOverlap, RowsWithLogitProcessingOrMinPRunOneStepAtATime) {
  for (int variant = 0; variant < 2; ++variant) {
    Request r = greedy(prompt_of(8, 3), 12);
    if (variant == 0) {
      r.sampling.repetition_penalty = 1.3f;
    } else {
      r.sampling.min_p = 0.05f;
    }
    auto model = std::make_unique<FakeRunner>(64);
    FakeRunner* m = model.get();
    m->device_sampling = true;
    m->launch_ahead = true;
    m->graph_buckets = {1, 2};
    EngineOptions o = small_opts(1024);
    o.overlap_schedule = true;
    Engine engine(std::move(model), o);
    Sink sink;
    const RequestId id = engine.submit(r, sink.cb());
    sink.wait_finished(1);
    EXPECT_EQ(sink.tokens(id).size(), 12u);
    engine.shutdown(true);
    EXPECT_EQ(m->launched_steps, 0) << "variant " << variant;
  }
}

}  // namespace
}  // namespace kiln
