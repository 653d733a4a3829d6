// SpecOffSwitch: the automatic off switch of speculative decoding. Per batch-size class it keeps moving
// estimates of what a decode step costs with and without verification and turns speculation off where it
// loses, so it never makes a workload slower for long:
//   plain    seconds of a plain decode step (one row per sequence)
//   verify   seconds of a verify step (k + 1 rows per sequence)
//   tokens   tokens a verify step gives per sequence (1 + accepted drafts: the acceptance length)
// Speculation pays at a class while verify / tokens < plain (seconds per token). Both estimates need
// min_samples observations before the switch decides; until then speculation stays as it is (on at first).
// Being on also costs the steps that have no drafts: under the overlap schedule a plain step launched ahead
// costs `plain` (the larger of its host and device parts), but while speculation is on every step waits for
// the last one's tokens to look for drafts, so a step without drafts costs its whole `wall` time. With f the
// share of on-steps that verified, the on state costs (f verify + (1 - f) wall) / (f tokens + 1 - f) a token
// against `plain` when off; where drafts are rare (f <= 1/8) one verify sample decides, since waiting for
// min_samples of them would cost more on-steps than it saves (n-gram at C = 32 on random weights: 10 rows
// drafted in a run of 64 prompts x 256 tokens, H100, 2026-12-07, docs/PERF.md SP6). Where wall equals plain
// (no overlap) this reduces to verify / tokens against plain. While off, one step in every probe interval
// at that class verifies anyway, so a workload whose acceptance grew is seen again; each probe that finds
// verification still losing doubles the class's interval (up to max_probe_interval; a probe with too few
// plain observations to decide leaves it), a turn back on resets it, so a workload that never accepts pays
// few probes. While on with too few plain observations, one step in eight runs plain to measure it.
//
// Shadow drafts (OffSwitchOptions::shadow, n-gram): a draft costs no target step to make, so while a class is
// off the engine still proposes drafts for some of its rows and, as the plain steps then decode the tokens
// the drafts guessed, reports each one's acceptance (observe_shadow: the tokens a verify step would have
// kept, the walk a verify step takes: a point draft's first mismatch ends it, and a sampled row's token
// equals the draft with the probability the point-draft rule keeps it). With it every class starts off, and a
// probe verifies only where the shadow promises a gain: accepted tokens a row-step a > F (verify / plain -
// 1), with F the chance that a step of this size has a draft at all and verify / plain the class's measured
// ratio (1 before any probe: then any acceptance at all). A workload that accepts nothing (random weights at
// C = 32) never runs a verify step, so it loses no learning phase; one that accepts turns on at its first
// probe.
//
// The switch only decides from the numbers it is given (observe_*): the engine feeds it measured step
// times, and tests feed fixed ones (EngineOptions::spec_step_cost), so no test depends on timing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::spec {

struct OffSwitchOptions {
  double alpha = 0.25;      // weight of a new observation in the moving averages
  int32_t min_samples = 4;  // observations of each kind before a class decides
  // Steps between probes of the other mode. A probe costs one verify step where verification loses (a few
  // percent of a step, once per interval); with acceptance varying request by request (batch 1 on the trained
  // model, 2026-12-06: the switch turned off 6 times in 12 requests of ~40 steps), a short interval lets a
  // request that quotes its prompt get speculation back within a few probes.
  int32_t probe_interval = 16;
  // The longest interval the doubling reaches. A probe at batch 32 where nothing is accepted cost a verify
  // step of 32 x (k + 1) rows for 1-2 drafting rows (4B shape, H100, 2026-12-07: 11.2 ms against a 6.8 ms
  // TPOT, one probe every 16 steps made the run 3 % slower; docs/PERF.md SP4).
  int32_t max_probe_interval = 128;
  // Batch-size classes whose sizes are all at least this many sequences start with verification off and turn
  // it on only when a probe measures it faster (0: every class starts on). While off a class learns from its
  // probes alone, so one probe's verify sample decides there. For the A/B of the learning phase at C = 32,
  // where a run that verifies nothing spends about 1 % of its time learning so (docs/PERF.md SP8): not yet
  // timed, so 0; KILN_SPEC_START_OFF_FROM=N sets it in kiln serve.
  int32_t start_off_from_seqs = 0;
  // Shadow drafts decide the probes (above): every class starts off, and while off a probe is due only where
  // observe_shadow's estimates promise a gain, the first one as soon as they do, later ones at the interval.
  bool shadow = false;
  double shadow_alpha = 1.0 / 16;  // weight of a new shadow draft (the plain mean of the first 16)
  int32_t shadow_min_samples = 4;  // shadow drafts judged before they can promise anything
};

class SpecOffSwitch {
 public:
  explicit SpecOffSwitch(OffSwitchOptions o = {}) : o_(o) {}

  // Whether the next decode step of `seqs` sequences (>= 1) with drafts should verify them. Counts the step
  // toward the class's next probe.
  bool should_verify(int32_t seqs);
  // A plain decode step: `seconds` as it would cost with speculation off (under the overlap schedule its
  // larger part), `wall` as it ran (< 0: the same as seconds).
  void observe_plain(int32_t seqs, double seconds, double wall = -1.0);
  // tokens_per_seq: the tokens the step gave per sequence, the target's own included (>= 1).
  void observe_verify(int32_t seqs, double seconds, double tokens_per_seq);
  // A shadow draft judged (OffSwitchOptions::shadow): made for a row of a step of `seqs` sequences, `drafted`
  // whether the drafter proposed anything there, `accepted` the tokens a verify step would have kept (0 when
  // nothing was proposed).
  void observe_shadow(int32_t seqs, int32_t accepted, bool drafted);
  // Whether the shadow drafts at `seqs` promise that verification could win (always true without shadow).
  bool shadow_promises(int32_t seqs) const;

  // A step at `seqs` that ran without asking (launched ahead by the overlap schedule while speculation is off
  // there): counts toward the class's next probe.
  void count_step(int32_t seqs) { at(seqs).count(); }
  // Whether the next step at `seqs` would be a probe (off, and the interval reached): the overlap schedule
  // ends its chain there so that step is planned, drafted and verified.
  bool probe_due(int32_t seqs) const;

  bool is_off(int32_t seqs) const;
  int64_t times_switched_off() const { return switched_off_; }
  // The class of a batch size: 1, 2, 3-4, 5-8, ... (powers of two) share estimates.
  static size_t batch_class(int32_t seqs);
  // A plain step's cost launched ahead under the overlap schedule, from one measured one step at a time
  // (`wall` seconds, `forward` of them the runner's forward): the host's part runs beside the next forward,
  // so the step costs the larger part, not their sum. forward is clamped to [0, wall].
  static double overlapped_step_cost(double wall, double forward);

 private:
  struct Estimate {
    double value = 0.0;
    int32_t samples = 0;
    void observe(double x, double alpha) {
      value = samples == 0 ? x : value + alpha * (x - value);
      ++samples;
    }
  };
  struct Class {
    Estimate plain, verify, tokens;
    Estimate plain_wall;                       // plain steps as they ran while on (no overlap)
    Estimate drafted;                          // 1 for an on-step that verified, 0 for one that ran plain
    Estimate shadow_accepted, shadow_drafted;  // a shadow draft's kept tokens; 1 where one was proposed
    bool off = false;
    int32_t since_probe = 0;
    // One more step toward the next probe. While off and the shadow drafts promise nothing the count runs on
    // (a server may do so for months), so it stops at the largest int32.
    void count() { since_probe += since_probe < INT32_MAX ? 1 : 0; }
    int32_t interval = 0;  // steps between probes while off (0: probe_interval)
  };
  Class& at(int32_t seqs);
  // Whether class k starts off (OffSwitchOptions::start_off_from_seqs): its smallest batch size reaches it.
  bool starts_off(size_t k) const;
  int32_t interval(const Class& c) const { return c.interval > 0 ? c.interval : o_.probe_interval; }
  // The drafted share's weight: the plain mean of its first 1 / alpha samples (a moving average started at
  // the first step's 0 or 1 would read a share of 1 in 2 as rare for its first dozen steps), then alpha.
  double drafted_weight(const Class& c) const { return std::max(o_.alpha, 1.0 / (c.drafted.samples + 1)); }
  // Whether the estimates sufficed to decide (a probe that could not decide leaves the interval as it is).
  bool decide(Class& c);
  bool promises(const Class& c, int32_t seqs) const;
  // Whether a probe is due at an off class: the interval reached (where the class never verified and shadow
  // drafts decide, at once), and the shadow drafts promising.
  bool probe_ready(const Class& c, int32_t seqs, int32_t since_probe) const;

  OffSwitchOptions o_;
  std::vector<Class> classes_;
  int64_t switched_off_ = 0;
};

}  // namespace kiln::spec
