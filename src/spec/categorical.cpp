#include "spec/categorical.h"

#include <algorithm>

namespace kiln::spec {
namespace {
bool contains(std::span<const int32_t> ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}
}  // namespace

double Categorical::prob(int32_t id) const {
  if (ids.empty()) return id >= 0 && size_t(id) < weights.size() ? weights[size_t(id)] / mass : 0.0;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return weights[i] / mass;
  return 0.0;
}

int32_t Categorical::draw(double u) const {
  return draw_without({}, u);
}

int32_t Categorical::draw_excluding(int32_t excluded, double u) const {
  return draw_without(std::span<const int32_t>(&excluded, excluded >= 0 ? 1 : 0), u);
}

double Categorical::prob_without(int32_t id, std::span<const int32_t> removed) const {
  if (removed.empty()) return prob(id);
  if (contains(removed, id)) return 0.0;
  double total = 0.0, w = 0.0;
  bool found = false;
  for (size_t i = 0; i < size(); ++i) {
    const int32_t c = id_at(i);
    if (contains(removed, c)) continue;
    total += weights[i];
    if (c == id && !found) w = weights[i], found = true;  // prob's first match
  }
  return total > 0.0 ? w / total : 0.0;
}

// The cumulative scan over the candidates left, in their order; with nothing removed the total is mass.
int32_t Categorical::draw_without(std::span<const int32_t> removed, double u) const {
  double total = mass;
  int32_t last = removed.empty() ? -1 : removed.back();
  if (!removed.empty()) {
    total = 0.0;
    for (size_t i = 0; i < size(); ++i)
      if (!contains(removed, id_at(i))) total += weights[i];
    if (!(total > 0.0)) return removed.back();
  }
  const double target = u * total;
  double acc = 0.0;
  for (size_t i = 0; i < size(); ++i) {
    const int32_t id = id_at(i);
    if (contains(removed, id)) continue;
    acc += weights[i];
    if (target < acc) return id;
    last = id;
  }
  return last;
}

}  // namespace kiln::spec
