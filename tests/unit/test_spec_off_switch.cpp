// The off switch of speculative decoding (spec/off_switch.h) decides from fixed step costs: it turns
// verification off for the batch sizes where seconds per token lose to plain decode, keeps it where they win,
// probes both ways, and comes back on when a probe sees acceptance grow. Through the engine (FakeRunner,
// injected costs via EngineOptions::spec_step_cost): a costly verify step turns itself off, a cheap one
// stays.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "runtime/fake_runner.h"
#include "spec/off_switch.h"

namespace kiln {
namespace {

using spec::OffSwitchOptions;
using spec::SpecOffSwitch;

TEST(SpecOffSwitch, BatchClassesArePowersOfTwo) {
  EXPECT_EQ(SpecOffSwitch::batch_class(1), 0u);
  EXPECT_EQ(SpecOffSwitch::batch_class(2), 1u);
  EXPECT_EQ(SpecOffSwitch::batch_class(3), 2u);
  EXPECT_EQ(SpecOffSwitch::batch_class(4), 2u);
  EXPECT_EQ(SpecOffSwitch::batch_class(5), 3u);
  EXPECT_EQ(SpecOffSwitch::batch_class(32), 5u);
  EXPECT_THROW(SpecOffSwitch::batch_class(0), Error);
}

// A plain step measured one at a time costs, launched ahead, its larger part: the forward where the GPU
// bounds it, the host's part where the host does.
TEST(SpecOffSwitch, OverlappedStepCostIsTheLargerPart) {
  EXPECT_DOUBLE_EQ(SpecOffSwitch::overlapped_step_cost(1.0, 0.7), 0.7);
  EXPECT_DOUBLE_EQ(SpecOffSwitch::overlapped_step_cost(1.0, 0.25), 0.75);
  EXPECT_DOUBLE_EQ(SpecOffSwitch::overlapped_step_cost(1.0, 0.5), 0.5);
  EXPECT_DOUBLE_EQ(SpecOffSwitch::overlapped_step_cost(1.0, 1.5), 1.0) << "forward clamped to the wall";
  EXPECT_DOUBLE_EQ(SpecOffSwitch::overlapped_step_cost(1.0, -1.0), 1.0);
}

// Feeds n steps of one kind at `seqs`: each asks the switch first, as the engine does, and is observed as
// the kind the switch chose. Returns how many verified.
int drive(SpecOffSwitch& s, int32_t seqs, int n, double plain, double verify, double tokens) {
  int verified = 0;
  for (int i = 0; i < n; ++i) {
    if (s.should_verify(seqs)) {
      s.observe_verify(seqs, verify, tokens);
      ++verified;
    } else {
      s.observe_plain(seqs, plain);
    }
  }
  return verified;
}

TEST(SpecOffSwitch, TurnsOffWhereVerifyLosesAndStaysOnWhereItWins) {
  OffSwitchOptions o;
  o.min_samples = 4;
  o.probe_interval = 16;
  SpecOffSwitch s(o);
  // Batch 32: a verify step costs 3 plain steps and gives 2 tokens: 1.5 > 1 seconds per token.
  for (int i = 0; i < 4; ++i) s.observe_plain(32, 1.0);
  EXPECT_TRUE(s.should_verify(32)) << "on until both estimates have min_samples";
  for (int i = 0; i < 3; ++i) s.observe_verify(32, 3.0, 2.0);
  EXPECT_FALSE(s.is_off(32));
  s.observe_verify(32, 3.0, 2.0);
  EXPECT_TRUE(s.is_off(32));
  EXPECT_EQ(s.times_switched_off(), 1);
  // Off: a probe after 16 steps, which finds verification still losing, then one after 32 more.
  EXPECT_EQ(drive(s, 32, 64, 1.0, 3.0, 2.0), 2);
  EXPECT_TRUE(s.is_off(32));
  EXPECT_EQ(s.times_switched_off(), 1);
  // Batch 1 is another class: 1.2 seconds for 2.5 tokens beats 1.0 per token.
  EXPECT_FALSE(s.is_off(1));
  for (int i = 0; i < 4; ++i) s.observe_plain(1, 1.0);
  EXPECT_EQ(drive(s, 1, 64, 1.0, 1.2, 2.5), 64);
  EXPECT_FALSE(s.is_off(1));
  // Exactly break-even stays on (verify / tokens must exceed plain to lose).
  for (int i = 0; i < 4; ++i) s.observe_plain(2, 1.0);
  EXPECT_EQ(drive(s, 2, 8, 1.0, 2.0, 2.0), 8);
  EXPECT_FALSE(s.is_off(2));
}

TEST(SpecOffSwitch, ProbesBringItBackWhenAcceptanceGrows) {
  OffSwitchOptions o;
  o.min_samples = 2;
  o.probe_interval = 8;
  o.alpha = 0.5;
  SpecOffSwitch s(o);
  for (int i = 0; i < 2; ++i) s.observe_plain(8, 1.0);
  drive(s, 8, 4, 1.0, 2.0, 1.5);  // 1.33 per token: off
  ASSERT_TRUE(s.is_off(8));
  // The workload changes: 4 tokens per verify (0.5 per token). Probes see it and the class comes back on.
  int steps = 0;
  while (s.is_off(8) && steps < 200) {
    drive(s, 8, 1, 1.0, 2.0, 4.0);
    ++steps;
  }
  EXPECT_FALSE(s.is_off(8));
  EXPECT_LE(steps, 3 * o.probe_interval) << "a few probes suffice";
}

// Each probe that finds verification still losing doubles the class's interval up to max_probe_interval;
// a turn back on resets it, so the next turn off probes at probe_interval again.
TEST(SpecOffSwitch, ProbeIntervalDoublesToItsCapAndResets) {
  OffSwitchOptions o;
  o.min_samples = 2;
  o.probe_interval = 4;
  o.max_probe_interval = 16;
  o.alpha = 1.0;  // the last observation decides
  SpecOffSwitch s(o);
  for (int i = 0; i < 2; ++i) s.observe_plain(8, 1.0);
  for (int i = 0; i < 2; ++i) s.observe_verify(8, 3.0, 1.0);
  ASSERT_TRUE(s.is_off(8));
  const auto probes = [&](int n, double tokens) {
    std::vector<int> at;
    for (int i = 1; i <= n; ++i)
      if (s.should_verify(8)) {
        s.observe_verify(8, 3.0, tokens);
        at.push_back(i);
      } else {
        s.observe_plain(8, 1.0);
      }
    return at;
  };
  EXPECT_EQ(probes(80, 1.0), (std::vector<int>{4, 12, 28, 44, 60, 76})) << "4, then 8, 16, 16, ...";
  // Acceptance grows: the next probe (step 12 here, 16 after the last) turns it on; the 8 steps after verify.
  EXPECT_EQ(probes(20, 4.0), (std::vector<int>{12, 13, 14, 15, 16, 17, 18, 19, 20}));
  EXPECT_FALSE(s.is_off(8));
  // It loses again: off at once, the first probe 4 steps later.
  EXPECT_EQ(probes(1, 1.0), (std::vector<int>{1}));
  ASSERT_TRUE(s.is_off(8));
  EXPECT_EQ(probes(6, 1.0), (std::vector<int>{4}));
}

// start_off_from_seqs = 17: the class of 17-32 sequences starts off (probe_interval 16) while the classes
// below start on; the class learns from its probes alone, one probe's verify sample deciding. A costly
// verify (3 plain steps' time for 1 token) keeps it off and the interval doubles; acceptance that makes it
// win (1.2 s for 3 tokens) turns it on at the next probe. A probe seeing too few plain steps to compare
// against decides nothing and leaves the interval (its sample decides once they are there).
TEST(SpecOffSwitch, LargeBatchesStartOffAndLearnFromProbes) {
  OffSwitchOptions o;
  o.min_samples = 4;
  o.probe_interval = 16;
  o.max_probe_interval = 64;
  o.alpha = 1.0;
  o.start_off_from_seqs = 17;
  SpecOffSwitch s(o);
  EXPECT_TRUE(s.is_off(32));
  EXPECT_TRUE(s.is_off(17));
  EXPECT_FALSE(s.is_off(16));
  EXPECT_FALSE(s.is_off(1));
  EXPECT_TRUE(s.should_verify(16)) << "below the threshold: on";
  EXPECT_FALSE(s.probe_due(32)) << "a fresh class probes after probe_interval steps";
  // A probe with no plain step seen: undecided, still off, the interval unchanged.
  for (int i = 1; i < 16; ++i) ASSERT_FALSE(s.should_verify(32)) << "step " << i;
  ASSERT_TRUE(s.should_verify(32)) << "the 16th step probes";
  s.observe_verify(32, 3.0, 1.0);
  EXPECT_TRUE(s.is_off(32)) << "nothing to compare the probe with";
  const auto probes = [&](int n, double verify, double tokens) {
    std::vector<int> at;
    for (int i = 1; i <= n; ++i)
      if (s.should_verify(32)) {
        s.observe_verify(32, verify, tokens);
        at.push_back(i);
      } else {
        s.observe_plain(32, 1.0);
      }
    return at;
  };
  // Losing probes: every 16 steps, then 32, 64, 64 (the interval doubles once a probe can decide).
  EXPECT_EQ(probes(200, 3.0, 1.0), (std::vector<int>{16, 48, 112, 176})) << "16, 32, 64, 64";
  EXPECT_TRUE(s.is_off(32));
  EXPECT_EQ(s.times_switched_off(), 0) << "it never was on";
  // Acceptance grows: the next probe (64 steps after the last) turns it on with one sample.
  const std::vector<int> at = probes(70, 1.2, 3.0);
  ASSERT_FALSE(at.empty());
  EXPECT_EQ(at.front(), 40);
  EXPECT_FALSE(s.is_off(32));
  EXPECT_EQ(at.size(), size_t(70 - 40 + 1)) << "on from the probe: every step verifies";
}

// Being on costs the plain steps their overlap: a plain step 1.0 s as it would run off (overlapped) but 1.3 s
// as it ran while on. A verify step of 1.5 s giving 2 tokens wins per step (0.75 s a token), but where one
// step in 16 has drafts the on state costs (1.5 / 16 + 1.3 x 15 / 16) / (2 / 16 + 15 / 16) = 1.24 s a token:
// off, and after one verify sample (drafts that rare would take ~64 steps to give four). One step in two
// with drafts: 0.93 s a token, on.
TEST(SpecOffSwitch, RareDraftsPayForTheOverlapTheyCost) {
  OffSwitchOptions o;
  o.min_samples = 4;
  o.alpha = 1.0 / 16;
  for (const int every : {16, 2}) {
    SpecOffSwitch s(o);
    int verified = 0;
    for (int i = 1; i <= 64 && !s.is_off(32); ++i) {
      if (i % every == 0 && s.should_verify(32)) {
        s.observe_verify(32, 1.5, 2.0);
        ++verified;
      } else {
        s.observe_plain(32, 1.0, 1.3);
      }
    }
    if (every == 16) {
      EXPECT_TRUE(s.is_off(32)) << "rare drafts: the on state's plain steps lose their overlap";
      EXPECT_EQ(verified, 1) << "one verify sample decides where drafts are rare";
    } else {
      EXPECT_FALSE(s.is_off(32)) << "frequent drafts pay for it";
    }
  }
  // Without the overlap (wall = plain) the rule is verify / tokens against plain, whatever the share.
  SpecOffSwitch s(o);
  for (int i = 1; i <= 64; ++i) {
    if (i % 16 == 0 && s.should_verify(32))
      s.observe_verify(32, 1.5, 2.0);
    else
      s.observe_plain(32, 1.0);
  }
  EXPECT_FALSE(s.is_off(32));
}

TEST(SpecOffSwitch, MeasuresPlainStepsWhenNoneWereSeen) {
  OffSwitchOptions o;
  o.min_samples = 4;
  SpecOffSwitch s(o);
  // Every step had drafts, so no plain step was ever measured: one in eight runs plain.
  const int verified = drive(s, 4, 4 + 32, 1.0, 1.5, 1.2);
  EXPECT_LT(verified, 4 + 32);
  EXPECT_TRUE(s.is_off(4)) << "1.5 / 1.2 > 1 once plain steps were measured";
}

// Shadow drafts decide the probes: every class starts off; with no shadow draft judged, or only drafts that
// kept nothing, no step ever verifies; the first promising estimate probes at once (no interval before a
// class's first probe), and once a probe has measured verify / plain = 3, a shadow acceptance of a tokens a
// row-step promises only where a > F x 2 (F the share of steps with a draft: 1 - (1 - f)^seqs for a share f
// of rows).
TEST(SpecOffSwitch, ShadowDraftsDecideTheProbes) {
  OffSwitchOptions o;
  o.min_samples = 2;
  o.probe_interval = 8;
  o.alpha = 1.0;
  o.shadow = true;
  o.shadow_min_samples = 4;
  o.shadow_alpha = 1.0 / 8;
  SpecOffSwitch s(o);
  EXPECT_TRUE(s.is_off(1));
  EXPECT_TRUE(s.is_off(32));
  EXPECT_FALSE(s.shadow_promises(32));
  const auto probes = [&](int32_t seqs, int n, double verify, double tokens) {
    std::vector<int> at;
    for (int i = 1; i <= n; ++i) {
      const bool due = s.probe_due(seqs) || !s.is_off(seqs);
      if (s.should_verify(seqs)) {
        EXPECT_TRUE(due) << "step " << i << ": probe_due said no";
        s.observe_verify(seqs, verify, tokens);
        at.push_back(i);
      } else {
        EXPECT_FALSE(due) << "step " << i << ": probe_due said yes";
        s.observe_plain(seqs, 1.0);
      }
    }
    return at;
  };
  EXPECT_TRUE(probes(32, 200, 3.0, 1.0).empty()) << "no shadow draft judged: never a probe";
  for (int i = 0; i < 100; ++i) s.observe_shadow(32, 0, i % 3 == 0);
  EXPECT_FALSE(s.shadow_promises(32));
  EXPECT_TRUE(probes(32, 200, 3.0, 1.0).empty()) << "shadow drafts kept nothing: never a probe";
  EXPECT_THROW(s.observe_shadow(32, 1, false), Error) << "kept tokens of a draft never proposed";
  // Batch 1: four shadow drafts, each kept 2 of its tokens (a = 2 > 0, no ratio measured yet): the first
  // step probes, and a verify of 1.5 plain steps for 3 tokens turns the class on.
  for (int i = 0; i < 3; ++i) s.observe_shadow(1, 2, true);
  EXPECT_FALSE(s.shadow_promises(1)) << "fewer than shadow_min_samples";
  s.observe_shadow(1, 2, true);
  EXPECT_TRUE(s.shadow_promises(1));
  EXPECT_EQ(probes(1, 1, 1.5, 3.0), (std::vector<int>{1})) << "the first probe at once";
  EXPECT_TRUE(s.is_off(1)) << "too few plain steps to compare with";
  EXPECT_EQ(probes(1, 6, 1.5, 3.0), (std::vector<int>{3, 4, 5, 6}))
      << "two plain steps measured, 1.5 s for 3 tokens wins: on";
  EXPECT_FALSE(s.is_off(1));
  // Batch 4 (class 3-4): a probe measures verify / plain = 3 for 1.2 tokens: off, the ratio known.
  SpecOffSwitch t(o);
  for (int i = 0; i < 8; ++i) t.observe_shadow(4, 1, true);
  ASSERT_TRUE(t.shadow_promises(4));
  for (int i = 0; i < 2; ++i) t.observe_plain(4, 1.0);
  ASSERT_TRUE(t.should_verify(4));
  t.observe_verify(4, 3.0, 1.2);
  EXPECT_TRUE(t.is_off(4));
  // a = 1 with every row drafting (F = 1): 1 > 2 fails; with a row share f = 0.1, F = 1 - 0.9^4 = 0.344:
  // a = 1 > 0.69 promises.
  EXPECT_FALSE(t.shadow_promises(4));
  for (int i = 0; i < 64; ++i) t.observe_shadow(4, i % 10 == 0 ? 10 : 0, i % 10 == 0);
  EXPECT_TRUE(t.shadow_promises(4)) << "a = 1 at f = 0.1";
  EXPECT_FALSE(t.probe_due(4)) << "a class that has probed waits for its interval";
}

// The engine's options for these tests: n-gram drafting of 3 tokens (window [1, 4]), a verify step costing
// verify_cost plain steps (EngineOptions::spec_step_cost: no clock). The tests before the shadow ones learn
// from verify steps (shadow drafts off, as EAGLE-3 always does).
EngineOptions ngram_opts(double verify_cost, bool shadow = false) {
  EngineOptions o = test::small_opts(4096, 4, 16);
  o.speculative.shadow_drafts = shadow;
  o.speculative.algorithm = spec::SpecAlgorithm::ngram;
  o.speculative.num_draft_tokens = 3;
  o.speculative.ngram_max = 4;
  o.spec_step_cost = [verify_cost](bool verify, int32_t) { return verify ? verify_cost : 1.0; };
  return o;
}

// The engine with fixed costs: FakeRunner's drafts are right about a third of the time, so verify rows give
// ~1.1 tokens at batch 1. At 10 plain steps per verify the switch turns speculation off; at 0.9 (a verify
// step always worth its cost) it stays on. Greedy
// outputs equal the reference either way. Requests run one at a time so the steps do not depend on timing.
TEST(SpecOffSwitch, EngineTurnsCostlyVerificationOff) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back({1, 2, 0, 1, 2, 0, 1, 2, 0, int32_t(i % 3)});
  for (const double verify_cost : {10.0, 0.9}) {
    EngineOptions o = ngram_opts(verify_cost);
    Engine engine(std::make_unique<FakeRunner>(3), o);
    test::Sink sink;
    std::vector<RequestId> ids;
    for (const auto& p : prompts) {  // one at a time: every step has batch 1, whatever the timing
      ids.push_back(engine.submit(test::greedy(p, 200), sink.cb()));
      sink.wait_finished(int(ids.size()));
    }
    const FakeRunner ref(3);
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_EQ(sink.tokens(ids[i]), ref.reference(prompts[i], 200, false));
    const spec::SpecStats st = engine.stats().spec;
    if (verify_cost > 5) {
      EXPECT_GE(st.switched_off, 1);
      EXPECT_LT(st.verify_steps, engine.stats().steps / 6)
          << "off after the first measures, then only probes";
    } else {
      EXPECT_EQ(st.switched_off, 0);
      EXPECT_GT(st.verify_steps, engine.stats().steps / 2);
    }
    std::printf("verify cost %.1f: %lld verify steps of %lld steps, switched off %lld times\n", verify_cost,
                (long long)st.verify_steps, (long long)engine.stats().steps, (long long)st.switched_off);
  }
}

// SpecOptions::start_off_from_seqs reaches the engine's switch: from batch 1 (every class off at first) a
// costly verify step never turns speculation on, so it never switches off and verifies only on probes, its
// greedy output the reference's; with it unset the same run verifies its first steps, then switches off.
TEST(SpecOffSwitch, EngineStartsOffWhereAsked) {
  const std::vector<int32_t> prompt = {1, 2, 0, 1, 2, 0, 1, 2, 0, 2};
  for (const int32_t start_off : {1, 0}) {
    EngineOptions o = ngram_opts(10.0);
    o.speculative.start_off_from_seqs = start_off;
    Engine engine(std::make_unique<FakeRunner>(3), o);
    test::Sink sink;
    const RequestId id = engine.submit(test::greedy(prompt, 200), sink.cb());
    sink.wait_finished(1);
    EXPECT_EQ(sink.tokens(id), FakeRunner(3).reference(prompt, 200, false));
    const spec::SpecStats st = engine.stats().spec;
    if (start_off) {
      EXPECT_EQ(st.switched_off, 0) << "never on";
      EXPECT_GE(st.verify_steps, 1) << "probes verify";
      EXPECT_LE(st.verify_steps, 6) << "probes only (after 16 steps, then 32, 64, ...)";
    } else {
      EXPECT_GE(st.switched_off, 1);
      EXPECT_GE(st.verify_steps, spec::OffSwitchOptions{}.min_samples);
    }
  }
}

// The overlap schedule with speculation on: steps launch ahead only where the switch turned speculation off
// (a costly verify step), never while it is on; outputs equal the reference either way.
TEST(SpecOffSwitch, OverlapScheduleResumesWhereSpeculationIsOff) {
  const std::vector<int32_t> prompt = {1, 2, 0, 1, 2, 0, 1, 2, 0, 2};
  for (const bool switch_on : {true, false}) {
    EngineOptions o = ngram_opts(10.0);
    o.speculative.off_switch = switch_on;
    auto runner = std::make_unique<FakeRunner>(3);
    runner->device_sampling = true;
    runner->launch_ahead = true;
    const FakeRunner& r = *runner;
    Engine engine(std::move(runner), o);
    test::Sink sink;
    const RequestId id = engine.submit(test::greedy(prompt, 300), sink.cb());
    sink.wait_finished(1);
    EXPECT_EQ(sink.tokens(id), FakeRunner(3).reference(prompt, 300, false));
    if (switch_on) {
      EXPECT_GT(r.chained_steps, 100) << "speculation off: the overlap schedule chains steps again";
      std::printf("overlap with the switch off: %lld chained steps, %lld verify steps of %lld\n",
                  (long long)r.chained_steps, (long long)engine.stats().spec.verify_steps,
                  (long long)engine.stats().steps);
      // Probes still verify once off, chains and all (after 16 steps, then 32, 64, 128, ...): beside the
      // first measures, at least two.
      EXPECT_GE(engine.stats().spec.verify_steps, spec::OffSwitchOptions{}.min_samples + 2)
          << "probes still verify";
      EXPECT_LE(engine.stats().spec.verify_steps, engine.stats().steps / 4) << "off: probes only";
    } else {
      EXPECT_EQ(r.launched_steps, 0) << "speculation always on: nothing may launch past a verify step";
    }
  }
}

// Shadow drafts through the engine (requests one at a time, FakeRunner deterministic: no timing). Over a
// vocabulary of 3 the drafts are right about a third of the time: a cheap verify step (0.9 plain steps) turns
// speculation on after the first shadow drafts promise it, a costly one (10) is probed once and never again.
// Over a vocabulary of 4,096 (random weights' case) no shadow draft keeps a token and no step ever verifies.
// Greedy outputs equal the reference in all three.
TEST(SpecOffSwitch, EngineLearnsFromShadowDrafts) {
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back({1, 2, 0, 1, 2, 0, 1, 2, 0, int32_t(i % 3)});
  struct Case {
    int64_t vocab;
    double verify_cost;
  };
  for (const Case c : {Case{3, 0.9}, Case{3, 10.0}, Case{4096, 0.9}}) {
    EngineOptions o = ngram_opts(c.verify_cost, true);
    auto runner = std::make_unique<FakeRunner>(c.vocab);
    runner->device_sampling = true;
    runner->launch_ahead = true;
    Engine engine(std::move(runner), o);
    test::Sink sink;
    std::vector<RequestId> ids;
    for (const auto& p : prompts) {
      ids.push_back(engine.submit(test::greedy(p, 200), sink.cb()));
      sink.wait_finished(int(ids.size()));
    }
    const FakeRunner ref(c.vocab);
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_EQ(sink.tokens(ids[i]), ref.reference(prompts[i], 200, false)) << "vocab " << c.vocab;
    const spec::SpecStats st = engine.stats().spec;
    const int64_t steps = engine.stats().steps;
    std::printf(
        "vocab %lld, verify cost %.1f: %lld verify steps of %lld, %lld shadow drafts keeping %lld "
        "tokens, switched off %lld times\n",
        (long long)c.vocab, c.verify_cost, (long long)st.verify_steps, (long long)steps,
        (long long)st.shadow_drafts, (long long)st.shadow_accepted_tokens, (long long)st.switched_off);
    EXPECT_GT(st.shadow_drafts, 0);
    EXPECT_EQ(st.switched_off, 0) << "never on where it loses";
    if (c.vocab == 4096) {
      EXPECT_EQ(st.shadow_accepted_tokens, 0);
      EXPECT_EQ(st.verify_steps, 0) << "nothing accepted: no learning phase";
    } else if (c.verify_cost > 1.0) {
      EXPECT_GT(st.shadow_accepted_tokens, 0);
      EXPECT_EQ(st.verify_steps, 1) << "one probe measures the ratio; the shadow never promises 10x";
    } else {
      EXPECT_GT(st.verify_steps, steps / 2) << "on once the shadow promised it";
      EXPECT_LT(st.shadow_drafts, 40) << "shadow drafts only while off";
    }
  }
}

// Shadow drafts with concurrent requests, launched ahead and verified in turn (the batch composition follows
// the timing, so only what does not depend on it is checked): every greedy output is the reference's, each
// request finishes once, and the drafts judged keep tokens (vocabulary 3: right about a third of the time).
TEST(SpecOffSwitch, ShadowDraftsUnderConcurrentRequests) {
  EngineOptions o = ngram_opts(0.9, true);
  auto runner = std::make_unique<FakeRunner>(3);
  runner->device_sampling = true;
  runner->launch_ahead = true;
  Engine engine(std::move(runner), o);
  test::Sink sink;
  std::vector<std::pair<RequestId, std::vector<int32_t>>> reqs;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> p = {1, 2, 0, 1, 2, 0, int32_t(i % 3), int32_t(i / 3 % 3)};
    reqs.emplace_back(engine.submit(test::greedy(p, 40 + 13 * i), sink.cb()), p);
  }
  sink.wait_finished(int(reqs.size()));
  const FakeRunner ref(3);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(sink.tokens(reqs[i].first), ref.reference(reqs[i].second, 40 + 13 * int(i), false)) << i;
  sink.expect_one_finish_each();
  const spec::SpecStats st = engine.stats().spec;
  EXPECT_GT(st.shadow_drafts, 0);
  EXPECT_GT(st.verify_steps, 0) << "cheap verification with accepting drafts turns on";
}

}  // namespace
}  // namespace kiln
