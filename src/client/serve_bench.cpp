#include "client/serve_bench.h"

#include <atomic>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "client/http.h"
#include "client/progress.h"
#include "kiln/error.h"

namespace kiln::client {

using clock_type = std::chrono::steady_clock;

RunOutput run_concurrent(const RunOptions& opt, const std::vector<RequestSpec>& specs, int concurrency,
                         const std::string& label) {
  KILN_CHECK(concurrency > 0, "concurrency must be positive, got ", concurrency);
  RunOutput out;
  out.results.resize(specs.size());
  if (specs.empty()) return out;
  const int workers = int(std::min<size_t>(size_t(concurrency), specs.size()));
  std::unique_ptr<Progress> bar;
  if (opt.progress) bar = std::make_unique<Progress>(label, specs.size());
  std::atomic<size_t> next{0};
  const auto t0 = clock_type::now();
  // Connections are made here so that a bad URL throws on this thread, not inside a worker.
  std::vector<std::unique_ptr<HttpClient>> clients;
  for (int w = 0; w < workers; ++w)
    clients.push_back(std::make_unique<HttpClient>(opt.base_url, opt.timeout_s, opt.api_key));
  std::vector<std::thread> threads;
  threads.reserve(size_t(workers));
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (size_t i = next++; i < specs.size(); i = next++) {
        try {
          out.results[i] = run_stream_request(*clients[size_t(w)], specs[i], opt.stream, t0);
        } catch (const std::exception& e) {  // e.g. a prompt that is not valid UTF-8: a failed request
          out.results[i] = RequestResult{};
          out.results[i].error = std::string("client: ") + e.what();
        }
        if (bar) bar->tick(!out.results[i].ok);
      }
    });
  }
  for (auto& t : threads) t.join();
  out.duration_s = std::chrono::duration<double>(clock_type::now() - t0).count();
  if (bar) bar->finish();
  return out;
}

size_t default_num_prompts(int c) {
  switch (c) {
    case 1:
      return 30;
    case 4:
      return 40;
    case 8:
      return 80;
    case 16:
      return 80;
    case 32:
      return 160;
    case 64:
      return 320;
    case 128:
      return 640;
    default:
      return size_t(std::max(30, 5 * c));
  }
}

LevelMetrics compute_level(int concurrency, const std::vector<RequestSpec>& specs, const RunOutput& run) {
  KILN_CHECK_EQ(specs.size(), run.results.size());
  LevelMetrics m;
  m.concurrency = concurrency;
  m.num_prompts = specs.size();
  m.duration_s = run.duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  size_t completed = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const RequestResult& r = run.results[i];
    const std::string why = check_accounting(specs[i], r);
    if (!r.ok) {
      ++m.failed;
    } else if (!why.empty()) {
      ++m.mismatched;
    } else {
      ++m.exact;
    }
    if (!why.empty() && m.notes.size() < 5) m.notes.push_back("request " + std::to_string(i) + ": " + why);
    if (!r.ok) continue;
    ++completed;
    m.output_tokens += r.completion_tokens;
    m.input_tokens += r.prompt_tokens;
    if (r.ttft_s >= 0) ttft.push_back(r.ttft_s * 1e3);
    e2e.push_back(r.e2e_s * 1e3);
    for (double g : r.itl_s) itl.push_back(g * 1e3);
    if (r.completion_tokens > 1 && r.ttft_s >= 0)
      tpot.push_back((r.e2e_s - r.ttft_s) / double(r.completion_tokens - 1) * 1e3);
  }
  const size_t bad = m.failed + m.mismatched;
  if (bad > 5) m.notes.push_back("... and " + std::to_string(bad - 5) + " more");
  m.valid = bad == 0 && !specs.empty();
  if (!m.valid)
    m.notes.insert(m.notes.begin(), "INVALID: " + std::to_string(bad) + " of " +
                                        std::to_string(specs.size()) +
                                        " requests did not complete with the asked token counts");
  if (m.duration_s > 0) {
    m.output_tok_s = double(m.output_tokens) / m.duration_s;
    m.input_tok_s = double(m.input_tokens) / m.duration_s;
    m.req_s = double(completed) / m.duration_s;
  }
  m.ttft_ms = summarize(ttft);
  m.tpot_ms = summarize(tpot);
  m.itl_ms = summarize(itl);
  m.e2e_ms = summarize(e2e);
  return m;
}

std::string flush_cache(const RunOptions& opt) {
  HttpClient http(opt.base_url, 120, opt.api_key);
  const HttpResponse r = http.post_json("/flush_cache", "{}");
  if (r.ok()) return "";
  if (!r.error.empty()) return "POST /flush_cache failed (" + r.error + "): cache not flushed";
  if (r.status == 404 || r.status == 405) {
    // vLLM's equivalent (served in its dev mode).
    const HttpResponse v = http.post_json("/reset_prefix_cache", "{}");
    if (v.ok()) return "";
    return "server has no /flush_cache (nor /reset_prefix_cache): cache flush skipped";
  }
  return "POST /flush_cache returned HTTP " + std::to_string(r.status) + ": cache may not be flushed";
}

std::string discover_model(const RunOptions& opt) {
  HttpClient http(opt.base_url, 30, opt.api_key);
  const HttpResponse r = http.get("/v1/models");
  if (!r.ok()) return "";
  const auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty()) return "";
  const auto& first = j["data"][0];
  return first.contains("id") && first["id"].is_string() ? first["id"].get<std::string>() : "";
}

std::string utc_now_iso() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void check_reachable(const RunOptions& opt) {
  HttpClient http(opt.base_url, 30, opt.api_key);
  const HttpResponse r = http.get("/health");  // any HTTP answer will do: some servers have no /health
  KILN_CHECK(r.error.empty(), "cannot reach ", opt.base_url, " (", r.error, " error)");
}

// Warm-up prompts come from their own stream, far from any measured tag, so they never share a prefix
// with measured prompts even where the cache cannot be flushed.
static constexpr uint64_t kWarmupTag = 0x5741524d55500000ull;

Window run_window(const SweepOptions& opt, int concurrency, size_t n, uint64_t tag,
                  const std::string& label) {
  KILN_CHECK(n > 0, "a window needs at least one request");
  std::vector<std::string> notes;
  const int64_t warmups = opt.warmups >= 0 ? opt.warmups : std::max<int64_t>(64, concurrency);
  if (warmups > 0) {
    Workload w = opt.workload;
    w.output_len = opt.warmup_output_len > 0 ? opt.warmup_output_len : std::min<int64_t>(w.output_len, 16);
    const auto specs = make_requests(w, kWarmupTag + tag, size_t(warmups));
    const RunOutput run = run_concurrent(opt.run, specs, concurrency, label + " warm-up");
    size_t failed = 0;
    std::string first_error;
    for (const auto& r : run.results)
      if (!r.ok && failed++ == 0) first_error = r.error;
    if (failed)
      notes.push_back(std::to_string(failed) + " of " + std::to_string(warmups) +
                      " warm-ups failed: " + first_error);
    const bool no_generate = opt.run.stream.api == Api::generate && first_error.rfind("HTTP 404", 0) == 0;
    KILN_CHECK(failed < size_t(warmups), "every warm-up request failed at concurrency ", concurrency, ": ",
               first_error, no_generate ? " (the server has no /generate: try --api completions)" : "");
  }
  if (opt.flush_cache) {
    const std::string note = flush_cache(opt.run);
    if (!note.empty()) notes.push_back(note);
  } else {
    notes.push_back("cache flush disabled (--no-flush)");
  }
  Window win;
  win.specs = make_requests(opt.workload, tag, n);
  win.run = run_concurrent(opt.run, win.specs, concurrency, label);
  win.metrics = compute_level(concurrency, win.specs, win.run);
  win.metrics.notes.insert(win.metrics.notes.end(), notes.begin(), notes.end());
  return win;
}

SweepResult run_sweep(const SweepOptions& opt, const LevelCallback& on_level) {
  KILN_CHECK(!opt.concurrency.empty(), "no concurrency levels");
  KILN_CHECK(opt.num_prompts.empty() || opt.num_prompts.size() == opt.concurrency.size(),
             "--num-prompts needs one count or one per level (", opt.concurrency.size(), " levels, ",
             opt.num_prompts.size(), " counts)");
  check_reachable(opt.run);
  SweepResult out;
  out.date_utc = utc_now_iso();
  for (size_t l = 0; l < opt.concurrency.size(); ++l) {
    const int c = opt.concurrency[l];
    const size_t n = opt.num_prompts.empty() ? default_num_prompts(c) : opt.num_prompts[l];
    try {
      out.levels.push_back(run_window(opt, c, n, uint64_t(c), "C=" + std::to_string(c)).metrics);
    } catch (const kiln::Error& e) {
      LevelMetrics m;
      m.concurrency = c;
      m.num_prompts = n;
      m.notes.push_back(std::string("INVALID: level aborted: ") + e.what());
      out.levels.push_back(m);
    }
    if (on_level) on_level(out);
  }
  return out;
}

}  // namespace kiln::client
