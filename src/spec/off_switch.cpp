#include "spec/off_switch.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "kiln/error.h"

namespace kiln::spec {

size_t SpecOffSwitch::batch_class(int32_t seqs) {
  KILN_CHECK(seqs >= 1, "SpecOffSwitch: a batch of ", seqs, " sequences");
  return size_t(std::bit_width(uint32_t(seqs - 1)));
}

double SpecOffSwitch::overlapped_step_cost(double wall, double forward) {
  const double f = std::clamp(forward, 0.0, wall);
  return std::max(f, wall - f);
}

bool SpecOffSwitch::starts_off(size_t k) const {
  const int64_t smallest = k == 0 ? 1 : (int64_t(1) << (k - 1)) + 1;
  return o_.shadow || (o_.start_off_from_seqs > 0 && smallest >= o_.start_off_from_seqs);
}

SpecOffSwitch::Class& SpecOffSwitch::at(int32_t seqs) {
  const size_t k = batch_class(seqs);
  for (size_t i = classes_.size(); i <= k; ++i) {
    classes_.emplace_back();
    classes_.back().off = starts_off(i);
  }
  return classes_[k];
}

bool SpecOffSwitch::is_off(int32_t seqs) const {
  const size_t k = batch_class(seqs);
  return k < classes_.size() ? classes_[k].off : starts_off(k);
}

bool SpecOffSwitch::promises(const Class& c, int32_t seqs) const {
  if (!o_.shadow) return true;
  if (c.shadow_accepted.samples < o_.shadow_min_samples || c.shadow_accepted.value <= 0.0) return false;
  // A step verifies where any of its rows drafted: with a share f of rows drafting, 1 - (1 - f)^seqs of them.
  const double f = std::clamp(c.shadow_drafted.value, 0.0, 1.0);
  const double steps = 1.0 - std::pow(1.0 - f, double(seqs));
  const double ratio = c.verify.samples > 0 && c.plain.samples > 0 && c.plain.value > 0.0
                           ? c.verify.value / c.plain.value
                           : 1.0;
  return c.shadow_accepted.value > steps * (ratio - 1.0);
}

bool SpecOffSwitch::shadow_promises(int32_t seqs) const {
  const size_t k = batch_class(seqs);
  return k < classes_.size() ? promises(classes_[k], seqs) : !o_.shadow;
}

bool SpecOffSwitch::probe_ready(const Class& c, int32_t seqs, int32_t since_probe) const {
  const bool first = o_.shadow && c.verify.samples == 0;
  return (first || since_probe >= interval(c)) && promises(c, seqs);
}

bool SpecOffSwitch::probe_due(int32_t seqs) const {
  const size_t k = batch_class(seqs);
  if (k >= classes_.size()) return false;
  const Class& c = classes_[k];
  return c.off && probe_ready(c, seqs, c.since_probe + 1);
}

bool SpecOffSwitch::should_verify(int32_t seqs) {
  Class& c = at(seqs);
  c.count();
  if (c.off) {  // a verify probe: has acceptance grown? (the count runs on past the interval until one is)
    if (!probe_ready(c, seqs, c.since_probe)) return false;
    c.since_probe = 0;
    return true;
  }
  if (c.since_probe >= interval(c)) c.since_probe = 0;
  // On, with too few plain steps to compare against: one step in eight runs plain to measure them.
  if (c.plain.samples < o_.min_samples && c.verify.samples >= o_.min_samples) return c.since_probe % 8 != 0;
  return true;
}

void SpecOffSwitch::observe_plain(int32_t seqs, double seconds, double wall) {
  Class& c = at(seqs);
  c.plain.observe(seconds, o_.alpha);
  if (!c.off) {
    c.plain_wall.observe(wall < 0.0 ? seconds : wall, o_.alpha);
    c.drafted.observe(0.0, drafted_weight(c));
  }
  decide(c);
}

void SpecOffSwitch::observe_verify(int32_t seqs, double seconds, double tokens_per_seq) {
  Class& c = at(seqs);
  c.verify.observe(seconds, o_.alpha);
  c.tokens.observe(tokens_per_seq, o_.alpha);
  if (!c.off) c.drafted.observe(1.0, drafted_weight(c));
  const bool was_off = c.off;
  const bool decided = decide(c);
  if (was_off && c.off && decided)
    c.interval = std::min(2 * interval(c), std::max(o_.probe_interval, o_.max_probe_interval));
}

void SpecOffSwitch::observe_shadow(int32_t seqs, int32_t accepted, bool drafted) {
  KILN_CHECK(accepted >= 0 && (drafted || accepted == 0), "SpecOffSwitch: a shadow draft of ", accepted,
             " accepted tokens, drafted ", drafted);
  Class& c = at(seqs);
  const double w = std::max(o_.shadow_alpha, 1.0 / (c.shadow_accepted.samples + 1));
  c.shadow_accepted.observe(double(accepted), w);
  c.shadow_drafted.observe(drafted ? 1.0 : 0.0, w);
}

bool SpecOffSwitch::decide(Class& c) {
  if (c.plain.samples < o_.min_samples || c.verify.samples < 1 || c.tokens.value <= 0.0) return false;
  // The share of on-steps that verified (1 until a step ran plain while on).
  const double f = c.drafted.samples > 0 ? c.drafted.value : 1.0;
  const bool rare = c.drafted.samples >= o_.min_samples && f <= 1.0 / 8;
  // Off, a verify sample comes only from a probe (where the class started off, before any min_samples of
  // them): one decides.
  if (c.verify.samples < o_.min_samples && !rare && !c.off) return false;
  const double wall = c.plain_wall.samples > 0 ? std::max(c.plain_wall.value, c.plain.value) : c.plain.value;
  const double on_cost = (f * c.verify.value + (1.0 - f) * wall) / (f * c.tokens.value + (1.0 - f));
  const bool loses = on_cost > c.plain.value;
  if (loses && !c.off) ++switched_off_;
  if (loses != c.off) c.since_probe = 0;
  if (!loses) c.interval = 0;
  c.off = loses;
  return true;
}

}  // namespace kiln::spec
