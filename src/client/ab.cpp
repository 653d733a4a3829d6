#include "client/ab.h"

#include <cstdio>

#include "client/report.h"
#include "kiln/error.h"

namespace kiln::client {

using json = nlohmann::json;

namespace {

double tpot_ms(const RequestResult& r) {
  return r.completion_tokens > 1 && r.ttft_s >= 0
             ? (r.e2e_s - r.ttft_s) / double(r.completion_tokens - 1) * 1e3
             : -1;
}

struct Reduction {
  const char* name;
  Reducer f;
};
constexpr Reduction kReductions[] = {
    {"mean", reduce_mean}, {"median", reduce_median}, {"p95", reduce_p95}, {"p99", reduce_p99}};

}  // namespace

AbResult compare_windows(const Window& a1, const Window& b, const Window& a2, int resamples, uint64_t seed) {
  KILN_CHECK(a1.specs.size() == b.specs.size() && a2.specs.size() == b.specs.size(),
             "A/B windows hold different request counts");
  AbResult out;
  out.a1 = a1.metrics;
  out.b = b.metrics;
  out.a2 = a2.metrics;
  out.valid = a1.metrics.valid && b.metrics.valid && a2.metrics.valid;
  if (!out.valid) out.notes.push_back("INVALID: at least one window failed exact accounting (see its notes)");

  // Per-request samples over requests that succeeded (with an output chunk) in all three windows.
  struct Series {
    const char* name;
    double (*get)(const RequestResult&);
    std::vector<double> v[3];
  };
  Series series[] = {{"ttft_ms", [](const RequestResult& r) { return r.ttft_s * 1e3; }, {}},
                     {"tpot_ms", tpot_ms, {}},
                     {"e2e_ms", [](const RequestResult& r) { return r.e2e_s * 1e3; }, {}}};
  const Window* w[3] = {&a1, &b, &a2};
  for (size_t i = 0; i < b.specs.size(); ++i) {
    bool all = true;
    for (const Window* x : w) {
      const RequestResult& r = x->run.results[i];
      all = all && r.ok && r.ttft_s >= 0 && tpot_ms(r) >= 0;
    }
    if (!all) continue;
    ++out.paired;
    for (auto& s : series)
      for (int k = 0; k < 3; ++k) s.v[k].push_back(s.get(w[k]->run.results[i]));
  }
  if (out.paired < b.specs.size())
    out.notes.push_back(
        std::to_string(b.specs.size() - out.paired) +
        " requests failed (or had one output token) in some window and were left out of the pairing");

  auto point = [](double x1, double y, double x2) {
    const double base = (x1 + x2) / 2;
    return base == 0 ? 0.0 : y / base - 1;
  };
  auto add_point = [&](const char* name, bool lower, double x1, double y, double x2) {
    AbMetric m{name, lower, x1, y, x2, false, {}};
    m.change.point = m.change.lo = m.change.hi = point(x1, y, x2);
    out.metrics.push_back(m);
  };
  add_point("output_tok_s", false, a1.metrics.output_tok_s, b.metrics.output_tok_s, a2.metrics.output_tok_s);
  add_point("req_s", false, a1.metrics.req_s, b.metrics.req_s, a2.metrics.req_s);

  uint64_t metric_seed = seed;
  for (const auto& s : series) {
    for (const auto& red : kReductions) {
      AbMetric m;
      m.name = std::string(s.name) + "." + red.name;
      if (out.paired >= 2) {
        m.a1 = red.f(s.v[0]);
        m.b = red.f(s.v[1]);
        m.a2 = red.f(s.v[2]);
        m.change = paired_change(s.v[0], s.v[1], s.v[2], red.f, resamples, metric_seed++);
        m.has_interval = true;
      }
      out.metrics.push_back(m);
    }
  }
  return out;
}

AbResult run_ab(const AbOptions& opt) {
  KILN_CHECK(!opt.url_a.empty() && !opt.url_b.empty(), "A/B needs both --a and --b");
  auto window = [&](const std::string& url, const std::string& model, const std::string& label) {
    SweepOptions s = opt.sweep;
    s.run.base_url = url;
    s.run.stream.model = model;
    // The same tag in every window: identical prompts in identical order.
    return run_window(s, opt.concurrency, opt.num_prompts, uint64_t(opt.concurrency), label);
  };
  const std::string date = utc_now_iso();
  const Window a1 = window(opt.url_a, opt.model_a, "A1");
  const Window b = window(opt.url_b, opt.model_b, "B");
  const Window a2 = window(opt.url_a, opt.model_a, "A2");
  AbResult r = compare_windows(a1, b, a2, opt.resamples, opt.bootstrap_seed);
  r.date_utc = date;
  return r;
}

json ab_to_json(const AbOptions& opt, const AbResult& r) {
  json metrics = json::array();
  for (const auto& m : r.metrics) {
    json j = {{"name", m.name}, {"lower_is_better", m.lower_is_better},
              {"a1", m.a1},     {"b", m.b},
              {"a2", m.a2},     {"change", m.change.point}};
    if (m.has_interval) j["change_ci95"] = {m.change.lo, m.change.hi};
    metrics.push_back(j);
  }
  return {{"tool", "kiln bench ab"},
          {"date_utc", r.date_utc},
          {"a", opt.url_a},
          {"b", opt.url_b},
          {"concurrency", opt.concurrency},
          {"num_prompts", opt.num_prompts},
          {"input_len", opt.sweep.workload.input_len},
          {"output_len", opt.sweep.workload.output_len},
          {"seed", opt.sweep.workload.seed},
          {"bootstrap", {{"resamples", opt.resamples}, {"seed", opt.bootstrap_seed}, {"level", 0.95}}},
          {"valid", r.valid},
          {"paired_requests", r.paired},
          {"notes", r.notes},
          {"windows", {{"A1", level_to_json(r.a1)}, {"B", level_to_json(r.b)}, {"A2", level_to_json(r.a2)}}},
          {"metrics", metrics}};
}

static std::string pct(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", v * 100);
  return buf;
}

std::string ab_to_markdown(const AbOptions& opt, const AbResult& r) {
  char head[512];
  std::snprintf(
      head, sizeof head,
      "A/B, %s: A = `%s`, B = `%s`; windows A1 -> B -> A2, C=%d, %zu requests each, %lld in / %lld out, "
      "seed %llu; %zu paired requests; bootstrap %d resamples.\n\n",
      r.date_utc.c_str(), opt.url_a.c_str(), opt.url_b.c_str(), opt.concurrency, opt.num_prompts,
      (long long)opt.sweep.workload.input_len, (long long)opt.sweep.workload.output_len,
      (unsigned long long)opt.sweep.workload.seed, r.paired, opt.resamples);
  std::string md = head;
  md +=
      "| metric | A1 | B | A2 | B vs mean(A1,A2) | 95% CI | better "
      "|\n|---|---:|---:|---:|---:|:---:|:---:|\n";
  for (const auto& m : r.metrics) {
    char row[512];
    std::snprintf(row, sizeof row, "| %s | %.2f | %.2f | %.2f | %s | %s | %s |\n", m.name.c_str(), m.a1, m.b,
                  m.a2, pct(m.change.point).c_str(),
                  m.has_interval ? ("[" + pct(m.change.lo) + ", " + pct(m.change.hi) + "]").c_str() : "n/a",
                  m.lower_is_better ? "lower" : "higher");
    md += row;
  }
  if (!r.notes.empty()) {
    md += "\nNotes:\n";
    for (const auto& n : r.notes) md += "- " + n + "\n";
  }
  for (const auto* w : {&r.a1, &r.b, &r.a2})
    for (const auto& n : w->notes) md += "- window note: " + n + "\n";
  return md;
}

}  // namespace kiln::client
