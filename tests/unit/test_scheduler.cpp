// Scheduler tests drive the four verbs with FakeRunner, which checks every context it reads back
// through the page table, and compare each request's greedy output with FakeRunner::reference().
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "kiln/error.h"
#include "runtime/fake_runner.h"
#include "runtime/scheduler.h"

namespace kiln {
namespace {

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = (i * 7 + salt * 13) % 50;
  return v;
}

struct Driver {
  KvPool pool;
  Scheduler sched;
  FakeRunner model{64};
  std::map<uint64_t, std::vector<int32_t>> prompts, outputs;
  std::map<uint64_t, int> max_new, cached;
  std::vector<uint64_t> finish_order;
  int64_t max_step_prefill = 0;

  Driver(int32_t num_pages, int32_t page_size, SchedulerOptions o)
      : pool(num_pages, page_size), sched(pool, o) {
    model.allocate_kv(num_pages, page_size);
  }
  void add(uint64_t id, std::vector<int32_t> prompt, int new_tokens) {
    auto s = std::make_unique<Sequence>();
    s->id = id;
    s->tokens = prompt;
    s->prompt_len = int32_t(prompt.size());
    s->max_len = int32_t(prompt.size()) + new_tokens;
    prompts[id] = std::move(prompt);
    max_new[id] = new_tokens;
    sched.admit(std::move(s));
  }
  // One engine step; returns false when there was nothing to do.
  bool step() {
    StepPlan plan = sched.schedule();
    sched.check_integrity();
    if (plan.empty()) return false;
    plan.batch.validate(model.config().vocab_size, pool.num_pages());
    max_step_prefill = std::max<int64_t>(max_step_prefill, plan.prefill_tokens);
    std::vector<float> logits;
    model.forward(plan.batch, &logits, nullptr);
    const int64_t V = model.config().vocab_size;
    std::vector<int32_t> sampled;
    for (size_t k = 0; k < plan.sample_rows.size(); ++k) {
      const float* row = logits.data() + k * size_t(V);
      sampled.push_back(int32_t(std::max_element(row, row + V) - row));
    }
    sched.finalize(plan, sampled);
    for (int32_t r : plan.sample_rows) {
      Sequence* s = plan.rows[size_t(r)].seq;
      if (int(s->tokens.size()) - s->prompt_len >= max_new[s->id]) {
        outputs[s->id].assign(s->tokens.begin() + s->prompt_len, s->tokens.end());
        cached[s->id] = s->cached_tokens;
        finish_order.push_back(s->id);
        sched.release(s->id);
      }
    }
    sched.check_integrity();
    return true;
  }
  int run(int max_steps = 100000) {
    int n = 0;
    while (n < max_steps && step()) ++n;
    return n;
  }
  void expect_reference_outputs() {
    for (auto& [id, p] : prompts) {
      ASSERT_TRUE(outputs.count(id)) << "request " << id << " never finished";
      EXPECT_EQ(outputs[id], model.reference(p, max_new[id], false)) << "request " << id;
    }
  }
  void expect_all_pages_free_after_flush() {
    sched.flush_cache();
    EXPECT_EQ(pool.num_free(), pool.num_usable());
    EXPECT_EQ(sched.num_running() + sched.num_waiting(), 0);
  }
};

TEST(Scheduler, SingleRequestMatchesReference) {
  Driver d(64, 4, {});
  d.add(1, prompt_of(10, 1), 12);
  EXPECT_EQ(d.run(), 12);  // one prefill step, then 11 decode steps
  d.expect_reference_outputs();
  d.expect_all_pages_free_after_flush();
}

TEST(Scheduler, ChunkedPrefillRespectsTheBudget) {
  SchedulerOptions o;
  o.chunked_prefill_size = 16;
  Driver d(64, 4, o);
  d.add(1, prompt_of(50, 2), 3);
  const int steps = d.run();
  EXPECT_EQ(steps, 4 + 2);  // ceil(50 / 16) prefill chunks, then 2 decodes
  EXPECT_EQ(d.max_step_prefill, 16);
  EXPECT_EQ(d.model.step_tokens[0], 16);
  EXPECT_EQ(d.model.step_tokens[3], 2);
  d.expect_reference_outputs();
  d.expect_all_pages_free_after_flush();
}

TEST(Scheduler, MixedBatchesCarryDecodeRowsAlongsideAPrefillChunk) {
  SchedulerOptions o;
  o.chunked_prefill_size = 8;
  Driver d(128, 4, o);
  d.add(1, prompt_of(5, 3), 20);
  d.step();
  d.step();  // request 1 is decoding now
  d.add(2, prompt_of(30, 4), 5);
  StepPlan plan = d.sched.schedule();
  ASSERT_EQ(plan.rows.size(), 2u);
  EXPECT_EQ(plan.decode_rows, (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(plan.decode_tokens, 1);
  EXPECT_EQ(plan.prefill_tokens, 8);
  EXPECT_EQ(plan.batch.logit_rows, (std::vector<int32_t>{0}));  // the chunk is not the prompt's end
  // Run the planned step by hand, then continue.
  std::vector<float> logits;
  d.model.forward(plan.batch, &logits, nullptr);
  const float* row = logits.data();
  d.sched.finalize(plan, {int32_t(std::max_element(row, row + 64) - row)});
  d.run();
  EXPECT_TRUE(d.model.saw_mixed_step);
  d.expect_reference_outputs();
  d.expect_all_pages_free_after_flush();
}

TEST(Scheduler, UnmixedModeNeverMixesAndGivesTheSameOutputs) {
  SchedulerOptions o;
  o.chunked_prefill_size = 8;
  o.enable_mixed_batches = false;
  Driver d(128, 4, o);
  for (int i = 0; i < 6; ++i) d.add(uint64_t(i), prompt_of(3 + 7 * i, i), 9);
  d.run();
  EXPECT_FALSE(d.model.saw_mixed_step);
  d.expect_reference_outputs();
  d.expect_all_pages_free_after_flush();
}

TEST(Scheduler, PreemptsUnderATinyPoolAndNeverFails) {
  SchedulerOptions o;
  o.reserve_init = 0.0;  // admit greedily so the pool runs out
  o.chunked_prefill_size = 16;
  Driver d(13, 4, o);  // 12 usable pages = 48 tokens; each request needs up to 40
  for (int i = 0; i < 8; ++i) d.add(uint64_t(i), prompt_of(6 + 3 * i, 10 + i), 16);
  d.run();
  EXPECT_GT(d.sched.total_preemptions(), 0);
  d.expect_reference_outputs();
  d.expect_all_pages_free_after_flush();
}

TEST(Scheduler, PreemptionWithoutPrefixCache) {
  SchedulerOptions o;
  o.reserve_init = 0.0;
  o.enable_prefix_cache = false;
  Driver d(11, 4, o);
  for (int i = 0; i < 6; ++i) d.add(uint64_t(i), prompt_of(10, 20 + i), 20);
  d.run();
  EXPECT_GT(d.sched.total_preemptions(), 0);
  d.expect_reference_outputs();
  EXPECT_EQ(d.pool.num_free(), d.pool.num_usable());  // nothing cached to flush
}

TEST(Scheduler, FirstComeFirstServed) {
  SchedulerOptions o;
  o.max_running_requests = 1;
  Driver d(64, 4, o);
  for (int i = 0; i < 5; ++i) d.add(uint64_t(10 - i), prompt_of(4 + i, i), 3);
  d.run();
  EXPECT_EQ(d.finish_order, (std::vector<uint64_t>{10, 9, 8, 7, 6}));
  d.expect_reference_outputs();
}

TEST(Scheduler, OldestRequestsFinishFirstUnderPreemption) {
  SchedulerOptions o;
  o.reserve_init = 0.0;
  Driver d(12, 4, o);
  for (int i = 0; i < 4; ++i) d.add(uint64_t(i), prompt_of(8, 30 + i), 24);
  d.run();
  EXPECT_EQ(d.finish_order.front(), 0u);  // preemption always takes the newest
  d.expect_reference_outputs();
}

TEST(Scheduler, AdmissionReserveAvoidsPreemptionThrash) {
  // Long prompts and long outputs in a pool that holds about three whole requests.
  auto run = [](double reserve, int64_t& preemptions, int64_t& prefill) {
    SchedulerOptions o;
    o.reserve_init = reserve;
    o.chunked_prefill_size = 64;
    Driver d(65, 4, o);  // 256 tokens
    for (int i = 0; i < 8; ++i) d.add(uint64_t(i), prompt_of(40, 40 + i), 40);
    while (d.step()) {
    }
    d.expect_reference_outputs();
    preemptions = d.sched.total_preemptions();
    prefill = 0;
    for (int32_t t : d.model.step_tokens) prefill += t;
  };
  int64_t p0 = 0, t0 = 0, p1 = 0, t1 = 0;
  run(0.0, p0, t0);
  run(0.7, p1, t1);
  EXPECT_GT(p0, 0);
  EXPECT_EQ(p1, 0);
  EXPECT_LT(t1, t0);  // less recomputation
}

TEST(Scheduler, TheReserveCountsCachedPagesWithoutEvictingThem) {
  SchedulerOptions o;
  o.reserve_init = 1.0;
  o.reserve_min = 1.0;
  Driver d(64, 4, o);  // 63 usable pages
  d.add(1, prompt_of(18, 1), 4);
  d.run();
  ASSERT_EQ(d.sched.cache()->num_pages(), 5);  // 21 computed tokens: 5 full pages
  // Needs 2 pages now and may grow to 60: 62 > 58 free, but <= 58 + 5 evictable.
  d.add(2, prompt_of(8, 2), 232);
  d.step();
  EXPECT_EQ(d.sched.num_running(), 1);
  EXPECT_EQ(d.sched.cache()->num_pages(), 5 + 2);  // nothing evicted; request 2's 2 prefilled pages added
  d.run();
  d.expect_reference_outputs();
}

TEST(Scheduler, ReleaseMidRequestFreesItsPages) {
  Driver d(64, 4, {});
  d.add(1, prompt_of(20, 5), 30);
  d.add(2, prompt_of(9, 6), 30);
  for (int i = 0; i < 5; ++i) d.step();
  EXPECT_EQ(d.sched.num_running(), 2);
  d.sched.release(1);
  d.sched.release(2);
  d.sched.release(3);  // unknown: ignored
  d.sched.check_integrity();
  EXPECT_EQ(d.sched.num_running(), 0);
  EXPECT_FALSE(d.step());
  d.expect_all_pages_free_after_flush();
}

TEST(Scheduler, ReleaseOfAWaitingRequest) {
  SchedulerOptions o;
  o.max_running_requests = 1;
  Driver d(64, 4, o);
  d.add(1, prompt_of(8, 1), 4);
  d.add(2, prompt_of(8, 2), 4);
  d.step();
  EXPECT_EQ(d.sched.num_waiting(), 1);
  d.sched.release(2);
  d.sched.check_integrity();
  d.run();
  EXPECT_EQ(d.finish_order, std::vector<uint64_t>{1});
}

TEST(Scheduler, PrefixReuseCountsCachedTokens) {
  Driver d(64, 4, {});
  auto p = prompt_of(18, 7);
  d.add(1, p, 4);
  d.run();
  EXPECT_EQ(d.cached[1], 0);
  auto q = p;
  q.push_back(3);
  q.push_back(4);
  d.add(2, q, 4);  // shares 18 prompt tokens = 4 full pages (16 tokens)
  d.add(3, p, 4);  // the same prompt: the last token is always recomputed, so 16 again
  d.run();
  EXPECT_EQ(d.cached[2], 16);
  EXPECT_EQ(d.cached[3], 16);
  // Generated tokens were cached too: prompt + output of request 1 covers 5 full pages.
  auto r = p;
  r.insert(r.end(), d.outputs[1].begin(), d.outputs[1].end());
  r.push_back(9);
  d.add(4, r, 2);
  d.run();
  EXPECT_EQ(d.cached[4], 20);
  d.expect_reference_outputs();
  d.expect_all_pages_free_after_flush();
}

TEST(Scheduler, RunningRequestsShareFullPagesWithLaterOnes) {
  SchedulerOptions o;
  o.chunked_prefill_size = 64;
  Driver d(64, 4, o);
  auto p = prompt_of(12, 8);
  d.add(1, p, 10);
  d.step();  // prefilled: 3 full pages offered while request 1 still runs
  auto q = p;
  q.push_back(1);
  d.add(2, q, 3);
  d.run();
  EXPECT_EQ(d.cached[2], 12);
  d.expect_reference_outputs();
}

TEST(Scheduler, RejectsRequestsLargerThanThePool) {
  KvPool pool(5, 4);  // 16 tokens
  Scheduler s(pool, {});
  auto seq = std::make_unique<Sequence>();
  seq->id = 1;
  seq->tokens = prompt_of(10, 1);
  seq->prompt_len = 10;
  seq->max_len = 17;
  EXPECT_THROW(s.admit(std::move(seq)), Error);
  s.check_integrity();
}

TEST(Scheduler, PaddedBatchesValidateAndSkipTheCacheWrite) {
  Driver d(32, 4, {});
  d.add(1, prompt_of(6, 1), 3);
  d.step();
  StepPlan plan = d.sched.schedule();
  ASSERT_EQ(plan.batch.num_seqs(), 1);
  pad_batch(plan.batch, 4);
  plan.batch.validate(64, d.pool.num_pages());
  EXPECT_EQ(plan.batch.num_seqs(), 4);
  EXPECT_EQ(plan.batch.slot_mapping[3], -1);
  EXPECT_EQ(plan.batch.logit_rows.size(), 1u);
  std::vector<float> logits;
  d.model.forward(plan.batch, &logits, nullptr);
  const float* row = logits.data();
  d.sched.finalize(plan, {int32_t(std::max_element(row, row + 64) - row)});
  d.run();
  d.expect_reference_outputs();
}

TEST(Scheduler, ManyRequestsRandomisedAgainstReference) {
  for (int cfg = 0; cfg < 4; ++cfg) {
    SchedulerOptions o;
    o.chunked_prefill_size = cfg % 2 ? 7 : 32;
    o.enable_mixed_batches = cfg < 2;
    o.max_running_requests = cfg == 3 ? 3 : 16;
    Driver d(40, 3, o);
    uint32_t rng = 12345u + uint32_t(cfg);
    auto next = [&] { return rng = rng * 1664525u + 1013904223u, int(rng >> 8); };
    for (int i = 0; i < 24; ++i) {
      // Some prompts share a prefix with earlier ones.
      auto p = prompt_of(1 + next() % 40, i % 5);
      if (i % 3 == 0) p.push_back(next() % 50);
      d.add(uint64_t(i), p, 1 + next() % 20);
      d.step();
    }
    d.run();
    d.expect_reference_outputs();
    d.expect_all_pages_free_after_flush();
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// plan_continuation: the step after a decode step, planned before that step is finalized, runs the same
// rows one token on; FakeRunner (its tokens taken as a device would: the previous step's argmax) checks
// every context it reads, and the outputs equal the reference. Pages are claimed across page boundaries,
// and a pool with no page left for a continuation says so without preempting.
TEST(Scheduler, ContinuationPlansTheNextDecodeStepBeforeFinalize) {
  Driver d(64, 4, {});
  for (int i = 0; i < 3; ++i) d.add(uint64_t(i + 1), prompt_of(5 + 3 * i, i), 9);
  while (d.sched.num_running() + d.sched.num_waiting() > 0) {
    StepPlan plan = d.sched.schedule();
    ASSERT_FALSE(plan.empty());
    std::vector<float> logits;
    d.model.forward(plan.batch, &logits, nullptr);
    const int64_t V = d.model.config().vocab_size;
    auto argmax = [&](const std::vector<float>& l) {
      std::vector<int32_t> t;
      for (size_t k = 0; k * size_t(V) < l.size(); ++k)
        t.push_back(
            int32_t(std::max_element(l.begin() + ptrdiff_t(k * V), l.begin() + ptrdiff_t((k + 1) * V)) -
                    (l.begin() + ptrdiff_t(k * V))));
      return t;
    };
    std::vector<int32_t> sampled = argmax(logits);
    bool all_decode = plan.prefill_tokens == 0;
    for (int32_t r : plan.sample_rows) {
      const Sequence* s = plan.rows[size_t(r)].seq;
      all_decode &= int(s->tokens.size()) - s->prompt_len + 2 <= d.max_new[s->id];
    }
    if (all_decode) {  // the continuation, run with the draws above as its tokens
      StepPlan next;
      ASSERT_TRUE(d.sched.plan_continuation(plan, &next));
      ASSERT_EQ(next.rows.size(), plan.rows.size());
      for (size_t i = 0; i < next.rows.size(); ++i) {
        EXPECT_EQ(next.rows[i].begin, plan.rows[i].begin + 1);
        EXPECT_EQ(next.batch.tokens[i], 0);  // drawn by the step before, on the device
        next.batch.tokens[i] = sampled[i];
      }
      d.sched.finalize(plan, sampled);
      d.sched.check_integrity();
      std::vector<float> logits2;
      d.model.forward(next.batch, &logits2, nullptr);
      d.sched.finalize(next, argmax(logits2));
    } else {
      d.sched.finalize(plan, sampled);
    }
    d.sched.check_integrity();
    std::vector<uint64_t> done;
    for (const StepRow& r : plan.rows)
      if (int(r.seq->tokens.size()) - r.seq->prompt_len >= d.max_new[r.seq->id]) done.push_back(r.seq->id);
    for (uint64_t id : done) {
      Sequence* s = d.sched.find(id);
      d.outputs[id].assign(s->tokens.begin() + s->prompt_len, s->tokens.end());
      d.sched.release(id);
    }
  }
  d.expect_reference_outputs();
  d.expect_all_pages_free_after_flush();

  // One page left for a continuation that needs two (both sequences' next tokens start a page): false,
  // nothing preempted; the page the first row took stays with its sequence.
  SchedulerOptions greedy_admission;
  greedy_admission.reserve_init = 0.0;
  Driver t(4, 4, greedy_admission);
  t.add(1, prompt_of(3, 1), 5);
  t.add(2, prompt_of(3, 2), 1);
  StepPlan p = t.sched.schedule();
  ASSERT_EQ(p.prefill_tokens, 6);
  std::vector<float> l;
  t.model.forward(p.batch, &l, nullptr);
  t.sched.finalize(p, {1, 2});
  StepPlan dec = t.sched.schedule();
  ASSERT_EQ(dec.decode_tokens, 2);
  ASSERT_EQ(t.pool.num_free(), 1);
  StepPlan cont;
  EXPECT_FALSE(t.sched.plan_continuation(dec, &cont));
  EXPECT_EQ(t.pool.num_free(), 0);
  EXPECT_EQ(t.sched.find(1)->pages.size(), 2u);
  EXPECT_EQ(t.sched.total_preemptions(), 0);
  t.sched.check_integrity();
}

}  // namespace
}  // namespace kiln
