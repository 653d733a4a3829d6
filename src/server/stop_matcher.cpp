#include "server/stop_matcher.h"

#include <algorithm>

namespace kiln::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

StopMatcher::Result StopMatcher::push(std::string_view delta) {
  Result r;
  if (matched_) return r;
  pending_.append(delta);
  if (stops_.empty()) {
    r.text.swap(pending_);
    return r;
  }
  // Earliest occurrence of any stop string; on a tie at one position the longest wins.
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (const auto& s : stops_) {
    const size_t p = pending_.find(s);
    if (p == std::string::npos) continue;
    if (p < best || (p == best && s.size() > which->size())) {
      best = p;
      which = &s;
    }
  }
  if (which) {
    matched_ = true;
    r.matched = true;
    r.stop = *which;
    r.text = pending_.substr(0, best);
    pending_.clear();
    return r;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    const size_t max_k = std::min(s.size() - 1, pending_.size());
    for (size_t k = max_k; k > hold; --k) {
      if (std::string_view(pending_).substr(pending_.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  r.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return r;
}

std::string StopMatcher::finish() {
  std::string out;
  if (!matched_) out.swap(pending_);
  pending_.clear();
  return out;
}

}  // namespace kiln::server
