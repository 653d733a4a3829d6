#include "spec/off_switch.h"

#include <algorithm>
#include <bit>

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
  return o_.start_off_from_seqs > 0 && smallest >= o_.start_off_from_seqs;
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

bool SpecOffSwitch::probe_due(int32_t seqs) const {
  const size_t k = batch_class(seqs);
  return k < classes_.size() && classes_[k].off && classes_[k].since_probe + 1 >= interval(classes_[k]);
}

bool SpecOffSwitch::should_verify(int32_t seqs) {
  Class& c = at(seqs);
  const bool probe = ++c.since_probe >= interval(c);
  if (probe) c.since_probe = 0;
  if (c.off) return probe;  // a verify probe: has acceptance grown?
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
