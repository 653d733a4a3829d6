#include "client/ab.h"

#include <array>
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

AbResult compare_windows(const std::vector<Window>& a, const std::vector<Window>& b, int resamples,
                         uint64_t seed) {
  KILN_CHECK(!b.empty() && a.size() == b.size() + 1, "A/B needs K B windows and K + 1 A windows, got ",
             b.size(), " and ", a.size());
  const size_t n = b[0].specs.size();
  for (const auto* ws : {&a, &b})
    for (const Window& w : *ws)
      KILN_CHECK(w.specs.size() == n && w.run.results.size() == n,
                 "A/B windows hold different request counts");
  AbResult out;
  out.valid = true;
  for (const Window& w : a) {
    out.a.push_back(w.metrics);
    out.valid = out.valid && w.metrics.valid;
  }
  for (const Window& w : b) {
    out.b.push_back(w.metrics);
    out.valid = out.valid && w.metrics.valid;
  }
  if (!out.valid) out.notes.push_back("INVALID: at least one window failed exact accounting (see its notes)");

  // Per-unit samples over (round, request) units whose three requests succeeded with an output chunk.
  struct Series {
    const char* name;
    double (*get)(const RequestResult&);
    std::vector<double> v[3];  // A left, B, A right
  };
  Series series[] = {{"ttft_ms", [](const RequestResult& r) { return r.ttft_s * 1e3; }, {}},
                     {"tpot_ms", tpot_ms, {}},
                     {"e2e_ms", [](const RequestResult& r) { return r.e2e_s * 1e3; }, {}}};
  for (size_t k = 0; k < b.size(); ++k) {
    const Window* w[3] = {&a[k], &b[k], &a[k + 1]};
    for (size_t i = 0; i < n; ++i) {
      bool all = true;
      for (const Window* x : w) {
        const RequestResult& r = x->run.results[i];
        all = all && r.ok && r.ttft_s >= 0 && tpot_ms(r) >= 0;
      }
      if (!all) continue;
      ++out.paired;
      for (auto& s : series)
        for (int j = 0; j < 3; ++j) s.v[j].push_back(s.get(w[j]->run.results[i]));
    }
  }
  if (out.paired < n * b.size())
    out.notes.push_back(std::to_string(n * b.size() - out.paired) +
                        " (round, request) units failed (or had one output token) in some window and were "
                        "left out of the pairing");

  // Window-level values: the mean over the A windows left of each B, over the Bs, and right of each B.
  auto window_means = [&](double (*get)(const LevelMetrics&)) {
    double l = 0, m = 0, r = 0;
    for (size_t k = 0; k < b.size(); ++k) {
      l += get(a[k].metrics);
      m += get(b[k].metrics);
      r += get(a[k + 1].metrics);
    }
    const double K = double(b.size());
    return std::array<double, 3>{l / K, m / K, r / K};
  };
  auto point = [](double x1, double y, double x2) {
    const double base = (x1 + x2) / 2;
    return base == 0 ? 0.0 : y / base - 1;
  };
  auto add_point = [&](const char* name, bool lower, double x1, double y, double x2) {
    AbMetric m{name, lower, x1, y, x2, false, {}};
    m.change.point = m.change.lo = m.change.hi = point(x1, y, x2);
    out.metrics.push_back(m);
  };
  const auto tok = window_means([](const LevelMetrics& m) { return m.output_tok_s; });
  const auto req = window_means([](const LevelMetrics& m) { return m.req_s; });
  add_point("output_tok_s", false, tok[0], tok[1], tok[2]);
  add_point("req_s", false, req[0], req[1], req[2]);

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
  KILN_CHECK(opt.rounds >= 1, "A/B needs at least one round");
  auto window = [&](const std::string& url, const std::string& model, const std::string& label) {
    SweepOptions s = opt.sweep;
    s.run.base_url = url;
    s.run.stream.model = model;
    // The same tag in every window: identical prompts in identical order.
    return run_window(s, opt.concurrency, opt.num_prompts, uint64_t(opt.concurrency), label);
  };
  const std::string date = utc_now_iso();
  std::vector<Window> a, b;
  for (int k = 0; k < opt.rounds; ++k) {
    a.push_back(window(opt.url_a, opt.model_a, "A" + std::to_string(k + 1)));
    b.push_back(window(opt.url_b, opt.model_b, "B" + std::to_string(k + 1)));
  }
  a.push_back(window(opt.url_a, opt.model_a, "A" + std::to_string(opt.rounds + 1)));
  AbResult r = compare_windows(a, b, opt.resamples, opt.bootstrap_seed);
  r.date_utc = date;
  return r;
}

json ab_to_json(const AbOptions& opt, const AbResult& r) {
  json windows = json::array();  // in time order: A1, B1, A2, B2, ..., A(K+1)
  for (size_t k = 0; k < r.a.size(); ++k) {
    windows.push_back({{"name", "A" + std::to_string(k + 1)}, {"metrics", level_to_json(r.a[k])}});
    if (k < r.b.size())
      windows.push_back({{"name", "B" + std::to_string(k + 1)}, {"metrics", level_to_json(r.b[k])}});
  }
  json metrics = json::array();
  for (const auto& m : r.metrics) {
    json j = {{"name", m.name},   {"lower_is_better", m.lower_is_better},
              {"a_before", m.a1}, {"b", m.b},
              {"a_after", m.a2},  {"change", m.change.point}};
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
          {"rounds", r.b.size()},
          {"windows", windows},
          {"metrics", metrics}};
}

static std::string pct(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", v * 100);
  return buf;
}

std::string ab_to_markdown(const AbOptions& opt, const AbResult& r) {
  const std::string order = r.b.size() == 1
                                ? "windows A1 -> B -> A2"
                                : "crossover windows A1 B1 A2 ... A" + std::to_string(r.a.size()) + " (" +
                                      std::to_string(r.b.size()) + " rounds)";
  char head[768];
  std::snprintf(head, sizeof head,
                "A/B, %s: A = `%s`, B = `%s`; %s, C=%d, %zu requests each, %lld in / %lld out, "
                "seed %llu; %zu paired units; bootstrap %d resamples. A before / A after: the A windows just "
                "before and "
                "just after each B.\n\n",
                r.date_utc.c_str(), opt.url_a.c_str(), opt.url_b.c_str(), order.c_str(), opt.concurrency,
                opt.num_prompts, (long long)opt.sweep.workload.input_len,
                (long long)opt.sweep.workload.output_len, (unsigned long long)opt.sweep.workload.seed,
                r.paired, opt.resamples);
  std::string md = head;
  md +=
      "| metric | A before | B | A after | B vs mean(A before, A after) | 95% CI | better "
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
  for (size_t k = 0; k < r.a.size(); ++k) {
    for (const auto& n : r.a[k].notes) md += "- window A" + std::to_string(k + 1) + ": " + n + "\n";
    if (k < r.b.size())
      for (const auto& n : r.b[k].notes) md += "- window B" + std::to_string(k + 1) + ": " + n + "\n";
  }
  return md;
}

}  // namespace kiln::client
