#include "spec/categorical.h"

namespace kiln::spec {

double Categorical::prob(int32_t id) const {
  if (ids.empty()) return id >= 0 && size_t(id) < weights.size() ? weights[size_t(id)] / mass : 0.0;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return weights[i] / mass;
  return 0.0;
}

int32_t Categorical::draw(double u) const {
  return draw_excluding(-1, u);
}

int32_t Categorical::draw_excluding(int32_t excluded, double u) const {
  double total = mass;
  int32_t last = excluded;
  if (excluded >= 0) {
    total = 0.0;
    for (size_t i = 0; i < size(); ++i)
      if (id_at(i) != excluded) total += weights[i];
    if (!(total > 0.0)) return excluded;
  }
  const double target = u * total;
  double acc = 0.0;
  for (size_t i = 0; i < size(); ++i) {
    const int32_t id = id_at(i);
    if (id == excluded) continue;
    acc += weights[i];
    if (target < acc) return id;
    last = id;
  }
  return last;
}

}  // namespace kiln::spec
