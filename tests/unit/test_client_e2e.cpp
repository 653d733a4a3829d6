// End to end against a tiny in-process fake server (httplib) speaking SGLang's /generate and OpenAI's
// /v1/completions: sweeps, exact accounting, cache flush notes, A/B, eval reference and eval gsm8k.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "client/ab.h"
#include "client/eval_reference.h"
#include "client/gsm8k.h"
#include "client/pool.h"
#include "client/report.h"
#include "client/serve_bench.h"
#include "common/test_support.h"
#include "kiln/error.h"

using namespace kiln::client;
using json = nlohmann::json;

namespace {

struct FakeConfig {
  int short_by = 0;      // stream this many fewer tokens than asked
  int prompt_extra = 0;  // report this many more prompt tokens than received
  bool has_flush = true;
  bool has_reset = false;                                    // vLLM's /reset_prefix_cache
  int fail_status = 0;                                       // answer every generation with this HTTP status
  int token_delay_us = 200;                                  // between streamed tokens
  std::string answer = "We add 3 and 4.\nThe answer is 7.";  // non-streamed completion text (gsm8k)
  double logprob_shift = 0;                                  // added to every log-prob (eval reference drift)
  int diverge_at = -1;  // greedy token index that differs (eval reference divergence)
};

class FakeServer {
 public:
  explicit FakeServer(FakeConfig cfg) : cfg_(std::move(cfg)) {
    srv_.Post("/generate",
              [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });
    srv_.Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });
    srv_.Post("/flush_cache", [this](const httplib::Request&, httplib::Response& res) {
      if (!cfg_.has_flush) {
        res.status = 404;
        return;
      }
      ++flushes;
      res.set_content("Cache flushed.", "text/plain");
    });
    srv_.Post("/reset_prefix_cache", [this](const httplib::Request&, httplib::Response& res) {
      if (!cfg_.has_reset) {
        res.status = 404;
        return;
      }
      ++flushes;
    });
    srv_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})",
                      "application/json");
    });
    srv_.set_tcp_nodelay(true);  // streamed chunks must not wait for the client's delayed ACK
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
    while (!srv_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeServer() {
    srv_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::atomic<int> flushes{0}, generations{0};
  std::string last_prompt;  // guarded by mu_
  std::mutex mu_;

 private:
  // Greedy "tokens" depend on the prompt only, so two runs agree unless diverge_at says otherwise.
  static std::string token_of(const std::string& prompt, int k) {
    return " t" + std::to_string((std::hash<std::string>{}(prompt) + size_t(k) * 7919) % 97);
  }

  void generate(const httplib::Request& req, httplib::Response& res, bool sglang) {
    ++generations;
    const json body = json::parse(req.body);
    if (cfg_.fail_status) {
      res.status = cfg_.fail_status;
      res.set_content(R"({"error":{"message":"fake failure"}})", "application/json");
      return;
    }
    int64_t n_in = 0, max_new = 0;
    std::string prompt;
    const json& p = sglang ? (body.contains("input_ids") ? body["input_ids"] : body["text"]) : body["prompt"];
    if (p.is_array()) {
      n_in = int64_t(p.size());
    } else {
      prompt = p.get<std::string>();
      n_in = 1 + int64_t(std::count(prompt.begin(), prompt.end(), ' '));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_prompt = prompt;
    }
    max_new =
        sglang ? body["sampling_params"]["max_new_tokens"].get<int64_t>() : body["max_tokens"].get<int64_t>();
    const int64_t n_out = std::max<int64_t>(0, max_new - cfg_.short_by);
    const int64_t n_prompt = n_in + cfg_.prompt_extra;
    if (!body.value("stream", false)) {
      json toks = json::array(), lps = json::array(), sg = json::array();
      std::string text;
      for (int k = 0; k < n_out; ++k) {
        const std::string t = k == cfg_.diverge_at ? " DIFFERENT" : token_of(prompt, k);
        const double lp = -0.1 * (k + 1) + cfg_.logprob_shift;
        toks.push_back(t);
        lps.push_back(lp);
        sg.push_back({lp, int(t.size() * 1000 + k), nullptr});
        text += t;
      }
      const bool want_lp = sglang ? body.value("return_logprob", false) : body.contains("logprobs");
      if (!want_lp) text = cfg_.answer;
      json out;
      if (sglang) {
        out = {{"text", text}, {"meta_info", {{"prompt_tokens", n_prompt}, {"completion_tokens", n_out}}}};
        if (want_lp) out["meta_info"]["output_token_logprobs"] = sg;
      } else {
        out = {{"choices", {{{"index", 0}, {"text", text}}}},
               {"usage", {{"prompt_tokens", n_prompt}, {"completion_tokens", n_out}}}};
        if (want_lp) out["choices"][0]["logprobs"] = {{"tokens", toks}, {"token_logprobs", lps}};
      }
      res.set_content(out.dump(), "application/json");
      return;
    }
    const int delay = cfg_.token_delay_us;
    res.set_chunked_content_provider("text/event-stream", [=](size_t, httplib::DataSink& sink) {
      for (int64_t k = 1; k <= n_out; ++k) {
        std::this_thread::sleep_for(std::chrono::microseconds(delay));
        json chunk;
        if (sglang)
          chunk = {{"text", "x"}, {"meta_info", {{"prompt_tokens", n_prompt}, {"completion_tokens", k}}}};
        else
          chunk = {{"choices", {{{"index", 0}, {"text", " x"}, {"finish_reason", nullptr}}}},
                   {"usage", nullptr}};
        const std::string s = "data: " + chunk.dump() + "\n\n";
        if (!sink.write(s.data(), s.size())) return false;
      }
      if (!sglang) {
        const std::string u = "data: " +
                              json{{"choices", json::array()},
                                   {"usage", {{"prompt_tokens", n_prompt}, {"completion_tokens", n_out}}}}
                                  .dump() +
                              "\n\n";
        sink.write(u.data(), u.size());
      }
      const std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
      sink.done();
      return true;
    });
  }

  FakeConfig cfg_;
  httplib::Server srv_;
  int port_ = 0;
  std::thread thread_;
};

SweepOptions small_sweep(const std::string& url, Api api) {
  SweepOptions o;
  o.run.base_url = url;
  o.run.stream.api = api;
  o.run.timeout_s = 30;
  o.run.progress = false;
  o.workload.input_len = 12;
  o.workload.output_len = 5;
  o.workload.vocab_lo = 10;
  o.workload.vocab_hi = 100;
  o.concurrency = {1, 2, 4};
  o.num_prompts = {3, 4, 8};
  o.warmups = 2;
  return o;
}

}  // namespace

TEST(ClientE2E, SweepThroughGenerateIsValidAndExact) {
  FakeServer srv({});
  const SweepOptions opt = small_sweep(srv.url(), Api::generate);
  const SweepResult r = run_sweep(opt);
  ASSERT_EQ(r.levels.size(), 3u);
  for (const auto& l : r.levels) {
    EXPECT_TRUE(l.valid) << "C=" << l.concurrency << ": " << (l.notes.empty() ? "" : l.notes[0]);
    EXPECT_EQ(l.exact, l.num_prompts);
    EXPECT_EQ(l.output_tokens, int64_t(l.num_prompts) * 5);
    EXPECT_EQ(l.input_tokens, int64_t(l.num_prompts) * 12);
    EXPECT_GT(l.output_tok_s, 0);
    EXPECT_NEAR(l.output_tok_s / l.req_s, 5.0, 1e-9);
    EXPECT_EQ(l.ttft_ms.n, l.num_prompts);
    EXPECT_EQ(l.tpot_ms.n, l.num_prompts);
    EXPECT_LE(l.ttft_ms.max, l.e2e_ms.max);
    EXPECT_GE(l.itl_ms.n, 1u);
    EXPECT_LE(l.itl_ms.n, l.num_prompts * 4);  // at most one gap per token after the first
    EXPECT_GT(l.tpot_ms.mean, 0.1);            // the fake sleeps 0.2 ms per token
    EXPECT_TRUE(l.notes.empty()) << l.notes[0];
  }
  EXPECT_EQ(srv.flushes.load(), 3);
  EXPECT_EQ(srv.generations.load(), 3 + 4 + 8 + 3 * 2);  // measured plus two warm-ups per level
}

TEST(ClientE2E, SweepThroughCompletionsNotesAMissingFlush) {
  FakeConfig cfg;
  cfg.has_flush = false;
  FakeServer srv(cfg);
  SweepOptions opt = small_sweep(srv.url(), Api::completions);
  opt.run.stream.model = discover_model(opt.run);
  EXPECT_EQ(opt.run.stream.model, "fake-model");
  opt.concurrency = {2};
  opt.num_prompts = {4};
  const SweepResult r = run_sweep(opt);
  ASSERT_EQ(r.levels.size(), 1u);
  EXPECT_TRUE(r.levels[0].valid);
  ASSERT_EQ(r.levels[0].notes.size(), 1u);
  EXPECT_NE(r.levels[0].notes[0].find("no /flush_cache"), std::string::npos) << r.levels[0].notes[0];
  EXPECT_EQ(srv.flushes.load(), 0);

  cfg.has_reset = true;  // vLLM-style: /reset_prefix_cache instead
  FakeServer vllm(cfg);
  opt.run.base_url = vllm.url();
  const SweepResult rv = run_sweep(opt);
  EXPECT_TRUE(rv.levels[0].notes.empty()) << rv.levels[0].notes[0];
  EXPECT_EQ(vllm.flushes.load(), 1);
}

TEST(ClientE2E, ShortOutputsMakeTheLevelInvalid) {
  FakeConfig cfg;
  cfg.short_by = 1;  // as if the server honoured EOS or counted max_tokens differently
  FakeServer srv(cfg);
  SweepOptions opt = small_sweep(srv.url(), Api::generate);
  opt.concurrency = {2};
  opt.num_prompts = {4};
  const auto l = run_sweep(opt).levels.at(0);
  EXPECT_FALSE(l.valid);
  EXPECT_EQ(l.mismatched, 4u);
  EXPECT_EQ(l.exact, 0u);
  ASSERT_FALSE(l.notes.empty());
  EXPECT_NE(l.notes[0].find("INVALID"), std::string::npos);
  EXPECT_NE(l.notes[1].find("completion_tokens 4 != asked 5"), std::string::npos) << l.notes[1];
}

TEST(ClientE2E, WrongPromptCountsAndHttpErrorsMakeTheLevelInvalid) {
  {
    FakeConfig cfg;
    cfg.prompt_extra = 1;  // e.g. a BOS token prepended to the ids
    FakeServer srv(cfg);
    SweepOptions opt = small_sweep(srv.url(), Api::completions);
    opt.concurrency = {1};
    opt.num_prompts = {2};
    const auto l = run_sweep(opt).levels.at(0);
    EXPECT_FALSE(l.valid);
    EXPECT_EQ(l.mismatched, 2u);
    EXPECT_NE(l.notes[1].find("prompt_tokens 13 != asked 12"), std::string::npos) << l.notes[1];
  }
  {
    FakeConfig cfg;
    cfg.fail_status = 503;
    FakeServer srv(cfg);
    SweepOptions opt = small_sweep(srv.url(), Api::generate);
    opt.warmups = 0;
    opt.concurrency = {2};
    opt.num_prompts = {3};
    const auto l = run_sweep(opt).levels.at(0);
    EXPECT_FALSE(l.valid);
    EXPECT_EQ(l.failed, 3u);
    EXPECT_NE(l.notes[1].find("HTTP 503"), std::string::npos) << l.notes[1];
    opt.warmups = 2;  // warm-ups that all fail abort the level with the reason; the sweep goes on
    opt.concurrency = {1, 2};
    opt.num_prompts = {1, 1};
    size_t calls = 0;
    const SweepResult r =
        run_sweep(opt, [&](const SweepResult& so_far) { EXPECT_EQ(so_far.levels.size(), ++calls); });
    EXPECT_EQ(calls, 2u);
    ASSERT_EQ(r.levels.size(), 2u);
    for (const auto& lv : r.levels) {
      EXPECT_FALSE(lv.valid);
      ASSERT_FALSE(lv.notes.empty());
      EXPECT_NE(lv.notes[0].find("every warm-up request failed"), std::string::npos) << lv.notes[0];
    }
  }
  try {  // nothing listens: the sweep fails at once, with the URL in the message
    run_sweep(small_sweep("http://127.0.0.1:1", Api::generate));
    ADD_FAILURE() << "no error for an unreachable server";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot reach http://127.0.0.1:1"), std::string::npos) << e.what();
  }
}

TEST(ClientE2E, ReportsCarryEveryLevel) {
  FakeServer srv({});
  SweepOptions opt = small_sweep(srv.url(), Api::generate);
  const SweepResult r = run_sweep(opt);
  const json j = sweep_to_json(opt, r, "m");
  ASSERT_EQ(j["levels"].size(), 3u);
  EXPECT_EQ(j["levels"][2]["concurrency"], 4);
  EXPECT_EQ(j["levels"][2]["valid"], true);
  for (const char* k : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"})
    for (const char* s : {"mean", "median", "p95", "p99"})
      EXPECT_TRUE(j["levels"][0][k].contains(s)) << k << s;
  EXPECT_EQ(j["workload"]["input_len"], 12);
  const std::string md = sweep_to_markdown(opt, r, "m");
  EXPECT_NE(md.find("| 4 | 8 | yes |"), std::string::npos) << md;
  const std::string svg = sweep_to_svg(r, "a <title> & more");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("a &lt;title&gt; &amp; more"), std::string::npos);
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\n') > 20, true);
  size_t circles = 0;
  for (size_t p = svg.find("<circle"); p != std::string::npos; p = svg.find("<circle", p + 1)) ++circles;
  EXPECT_EQ(circles, 9u);  // three levels in each of three panels
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(ClientE2E, AbDetectsASlowerServer) {
  FakeConfig fast, slow;
  fast.token_delay_us = 300;
  slow.token_delay_us = 8000;  // wide margins: the CI host may be busy
  FakeServer a(fast), b(slow);
  AbOptions opt;
  opt.sweep = small_sweep("", Api::generate);
  opt.url_a = a.url();
  opt.url_b = b.url();
  opt.concurrency = 2;
  opt.num_prompts = 8;
  opt.resamples = 500;
  const AbResult r = run_ab(opt);
  EXPECT_TRUE(r.valid);
  EXPECT_EQ(r.paired, 8u);
  bool found = false;
  for (const auto& m : r.metrics) {
    if (m.name != "tpot_ms.mean") continue;
    found = true;
    EXPECT_TRUE(m.has_interval);
    EXPECT_GT(m.change.point, 1.0);  // about 8 ms against about 0.3 ms per token
    EXPECT_GT(m.change.lo, 0.5) << "tpot mean A1 " << m.a1 << " B " << m.b << " A2 " << m.a2 << " ms";
    EXPECT_LE(m.change.lo, m.change.point);
    EXPECT_GE(m.change.hi, m.change.point);
  }
  EXPECT_TRUE(found);
  const json j = ab_to_json(opt, r);
  ASSERT_EQ(j["windows"].size(), 3u);
  EXPECT_EQ(j["windows"][1]["name"], "B1");
  EXPECT_EQ(j["windows"][1]["metrics"]["valid"], true);
  EXPECT_NE(ab_to_markdown(opt, r).find("tpot_ms.mean"), std::string::npos);
}

TEST(ClientE2E, EvalReferenceAgainstAFakeServer) {
  for (Api api : {Api::completions, Api::generate}) {
    FakeServer same({});
    FakeConfig drift_cfg;
    drift_cfg.logprob_shift = 0.01;
    drift_cfg.diverge_at = 3;
    FakeServer drift(drift_cfg);
    auto run = [&](const std::string& url) {
      RefDump d;
      d.api = api_name(api);
      d.max_tokens = 6;
      const auto prompts = default_reference_prompts();
      d.records.resize(prompts.size());
      parallel_requests(url, 30, "", prompts.size(), 3, [&](HttpClient& http, size_t i) {
        d.records[i] = query_greedy(http, api, "fake-model", prompts[i], d.max_tokens);
      });
      return dump_from_json(dump_to_json(d));  // through the stored form, as the CLI does
    };
    const RefDump ref = run(same.url());
    ASSERT_EQ(ref.records[0].tokens.size(), 6u);
    const ReferenceReport r1 = compare_dumps(ref, run(same.url()));
    EXPECT_EQ(r1.agreement_rate, 1.0);
    EXPECT_EQ(r1.max_abs_drift, 0.0);
    const ReferenceReport r2 = compare_dumps(ref, run(drift.url()));
    EXPECT_EQ(r2.agreement_rate, 0.0);
    EXPECT_EQ(r2.per_prompt[5].first_divergence, 3);
    EXPECT_NEAR(r2.max_abs_drift, 0.01, 1e-9);
    EXPECT_NEAR(r2.token_agreement, 0.5, 1e-12);
  }
}

TEST(ClientE2E, Gsm8kScoresAndWritesRecords) {
  FakeServer srv({});  // always answers "... The answer is 7."
  const std::string path =
      (kiln::test_support::process_scratch_dir("client_e2e") / "gsm_fake.jsonl").string();
  std::ofstream(path) << R"({"question":"Shot one?","answer":"1 + 1 = 2\n#### 2"}
{"question":"What is 3 + 4?","answer":"3 + 4 = <<3+4=7>>7\n#### 7"}
{"question":"What is 4 + 4?","answer":"#### 8"}
{"question":"What is 14 / 2?","answer":"#### 7.00"}
)";
  GsmOptions opt;
  opt.base_url = srv.url();
  opt.shots = 1;
  opt.concurrency = 2;
  opt.max_tokens = 32;
  const GsmResult r = run_gsm8k(opt, load_gsm8k(path));
  ASSERT_EQ(r.records.size(), 3u);
  EXPECT_EQ(r.correct, 2u);
  EXPECT_NEAR(r.accuracy, 2.0 / 3, 1e-12);
  EXPECT_EQ(r.records[0].index, 1u);
  EXPECT_TRUE(r.records[0].correct);
  EXPECT_FALSE(r.records[1].correct);
  EXPECT_EQ(r.records[1].prediction, "7");
  EXPECT_EQ(r.records[1].reference, "8");
  EXPECT_TRUE(r.records[2].correct);  // "7.00" and "7" normalise to the same number
  {
    std::lock_guard<std::mutex> lock(srv.mu_);
    EXPECT_EQ(srv.last_prompt.rfind("Question: Shot one?\nAnswer: 1 + 1 = 2\n#### 2\n\nQuestion: ", 0), 0u)
        << srv.last_prompt;
  }
  opt.limit = 1;
  EXPECT_EQ(run_gsm8k(opt, load_gsm8k(path)).records.size(), 1u);
  opt.api = Api::generate;
  opt.limit = -1;
  EXPECT_EQ(run_gsm8k(opt, load_gsm8k(path)).correct, 2u);
}
