// `kiln eval reference` and `kiln eval gsm8k`: accuracy checks against any OpenAI-compatible server.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "cli/command.h"
#include "cli/flags.h"
#include "client/eval_reference.h"
#include "client/gsm8k.h"
#include "client/pool.h"
#include "client/report.h"
#include "client/serve_bench.h"
#include "client/workload.h"
#include "kiln/error.h"

namespace {

using namespace kiln;

constexpr const char* kRefHelp =
    "usage: kiln eval reference --base-url URL --dump FILE [--write] [flags]\n"
    "  --write                 query the server and store its greedy outputs (with each step's top-2\n"
    "                          alternatives) as the dump FILE\n"
    "  (without --write)       query the server on the dump's prompts and compare with it\n"
    "  --prompts FILE          prompts for --write (one per line or JSONL {\"prompt\"}; default: built-in "
    "set)\n"
    "  --max-tokens N          greedy tokens per prompt for --write (default 32)\n"
    "  --api completions|generate (default completions); --model NAME; --api-key KEY\n"
    "  --concurrency N         parallel requests (default 4); --timeout S (default 600)\n"
    "  --out FILE              write the comparison report as JSON\n"
    "  --min-agreement X       exit 3 when the prompt agreement rate is below X\n"
    "  --max-drift X           exit 3 when the largest |log-prob drift| on the common prefix exceeds X\n"
    "  --tie-margin X          a divergence is a near tie when the candidate took the reference's runner-up\n"
    "                          and the reference's top-1 minus top-2 logprob is <= X nats (default 0.05)\n";

std::string pick_model(const cli::Flags& f, const std::string& url, client::Api api, const std::string& key) {
  std::string model = f.str("model");
  if (model.empty() && api == client::Api::completions) {
    client::RunOptions probe;
    probe.base_url = url;
    probe.api_key = key;
    model = client::discover_model(probe);
  }
  return model;
}

int run_eval_reference(const cli::Args& args) {
  const cli::Flags f(args,
                     {"base-url", "dump", "prompts", "max-tokens", "api", "model", "api-key", "concurrency",
                      "timeout", "out", "min-agreement", "max-drift", "tie-margin"},
                     {"write", "help"});
  if (f.flag("help")) {
    std::fputs(kRefHelp, stdout);
    return 0;
  }
  const std::string url = f.required("base-url"), dump_path = f.required("dump"), key = f.str("api-key");
  client::parse_base_url(url);
  const int conc = int(f.i64("concurrency", 4));
  const double timeout = f.f64("timeout", 600);
  KILN_CHECK(conc > 0 && conc <= 256, "--concurrency must be in [1, 256]");
  KILN_CHECK(timeout > 0, "--timeout must be positive");
  const double tie_margin = f.f64("tie-margin", client::kDefaultTieMargin);
  KILN_CHECK(tie_margin >= 0, "--tie-margin must be >= 0");

  client::RefDump ref;
  const bool write = f.flag("write");
  if (write) {
    ref.api = f.str("api", "completions");
    ref.max_tokens = f.i64("max-tokens", 32);
    KILN_CHECK(ref.max_tokens > 0 && ref.max_tokens <= 65536, "--max-tokens must be in [1, 65536]");
    std::vector<std::string> prompts;
    if (f.has("prompts")) {
      for (const auto& p : client::load_prompts(f.str("prompts"))) prompts.push_back(p.text);
    } else {
      prompts = client::default_reference_prompts();
    }
    for (const auto& p : prompts) ref.records.push_back({p, "", {}, {}});
  } else {
    KILN_CHECK(!f.has("prompts") && !f.has("max-tokens"),
               "--prompts and --max-tokens apply to --write; a comparison uses the dump's");
    ref = client::load_dump(dump_path);
    KILN_CHECK(!f.has("api") || f.str("api") == ref.api, "the dump was taken through ", ref.api, ", not ",
               f.str("api"));
  }
  const client::Api api = client::parse_api(ref.api);
  client::RefDump got;
  got.api = ref.api;
  got.max_tokens = ref.max_tokens;
  got.model = pick_model(f, url, api, key);
  got.source = url;
  got.date_utc = client::utc_now_iso();
  got.records.resize(ref.records.size());
  client::parallel_requests(
      url, timeout, key, ref.records.size(), conc, [&](client::HttpClient& http, size_t i) {
        got.records[i] = client::query_greedy(http, api, got.model, ref.records[i].prompt, ref.max_tokens);
      });

  if (write) {
    client::write_text_file(dump_path, client::dump_to_json(got).dump(1) + "\n");
    size_t tokens = 0;
    for (const auto& r : got.records) tokens += r.tokens.size();
    std::printf("wrote %s: %zu prompts, %zu greedy tokens, api %s, model '%s'\n", dump_path.c_str(),
                got.records.size(), tokens, got.api.c_str(), got.model.c_str());
    return 0;
  }
  const client::ReferenceReport rep = client::compare_dumps(ref, got, tie_margin);
  std::printf("reference %s (%s, %s) vs %s\n", dump_path.c_str(), ref.source.c_str(), ref.date_utc.c_str(),
              url.c_str());
  std::printf("prompts %zu, identical %zu, agreement rate %.4f, token agreement %.4f\n", rep.prompts,
              rep.identical, rep.agreement_rate, rep.token_agreement);
  std::printf("log-prob drift on the common prefix: mean |d| %.3g, max |d| %.3g\n", rep.mean_abs_drift,
              rep.max_abs_drift);
  std::printf("%s\n", client::near_tie_summary(rep).c_str());
  for (const auto& c : rep.per_prompt) {
    if (c.first_divergence < 0) continue;
    char margin[128] = "ref margin unknown";
    if (!std::isnan(c.ref_margin))
      std::snprintf(margin, sizeof margin, "ref margin %.3g, got %s the runner-up", c.ref_margin,
                    c.got_was_runner_up ? "was" : "was not");
    if (!std::isnan(c.got_margin))
      std::snprintf(margin + std::strlen(margin), sizeof margin - std::strlen(margin), ", got margin %.3g",
                    c.got_margin);
    std::printf(
        "  prompt %zu diverges at token %lld of %zu: ref '%s' vs got '%s' (max |d| before: %.3g; %s%s)\n",
        c.index, (long long)c.first_divergence, c.ref_tokens, c.ref_token.c_str(), c.got_token.c_str(),
        c.max_abs_drift, margin, c.near_tie ? ": near tie" : "");
  }
  if (f.has("out")) {
    nlohmann::json j = client::report_to_json(rep);
    j["reference"] = {
        {"path", dump_path}, {"source", ref.source}, {"date_utc", ref.date_utc}, {"model", ref.model}};
    j["candidate"] = {{"source", url}, {"date_utc", got.date_utc}, {"model", got.model}};
    client::write_text_file(f.str("out"), j.dump(2) + "\n");
  }
  int rc = 0;
  if (f.has("min-agreement") && rep.agreement_rate < f.f64("min-agreement", 0)) {
    std::fprintf(stderr, "kiln eval reference: agreement %.4f below --min-agreement %s\n", rep.agreement_rate,
                 f.str("min-agreement").c_str());
    rc = 3;
  }
  if (f.has("max-drift") && rep.max_abs_drift > f.f64("max-drift", 0)) {
    std::fprintf(stderr, "kiln eval reference: max drift %.3g above --max-drift %s\n", rep.max_abs_drift,
                 f.str("max-drift").c_str());
    rc = 3;
  }
  return rc;
}

constexpr const char* kGsmHelp =
    "usage: kiln eval gsm8k --base-url URL --data FILE.jsonl [flags]\n"
    "  --data FILE.jsonl       GSM8K-format lines {\"question\", \"answer\" ending in \"#### N\"}\n"
    "  --shots K               few-shot examples (default 5): from --fewshot FILE, else the data's first K\n"
    "  --limit N               evaluate at most N questions; --max-tokens N (default 256)\n"
    "  --api completions|generate (default completions); --model NAME; --api-key KEY\n"
    "  --concurrency N         parallel requests (default 8); --timeout S (default 600)\n"
    "  --out FILE.jsonl        per-question records (index, question, reference, prediction, correct, "
    "output)\n"
    "  --compare OTHER.jsonl   list the questions whose correctness differs from an earlier run's records\n";

int run_eval_gsm8k(const cli::Args& args) {
  const cli::Flags f(args,
                     {"base-url", "data", "shots", "fewshot", "limit", "max-tokens", "api", "model",
                      "api-key", "concurrency", "timeout", "out", "compare"},
                     {"help"});
  if (f.flag("help")) {
    std::fputs(kGsmHelp, stdout);
    return 0;
  }
  client::GsmOptions opt;
  opt.base_url = f.required("base-url");
  client::parse_base_url(opt.base_url);
  opt.api = client::parse_api(f.str("api", "completions"));
  opt.api_key = f.str("api-key");
  opt.shots = int(f.i64("shots", 5));
  KILN_CHECK(opt.shots >= 0 && opt.shots <= 64, "--shots must be in [0, 64]");
  opt.limit = f.i64("limit", -1);
  KILN_CHECK(opt.limit >= -1, "--limit must be >= 0");
  opt.max_tokens = f.i64("max-tokens", 256);
  opt.concurrency = int(f.i64("concurrency", 8));
  KILN_CHECK(opt.concurrency > 0 && opt.concurrency <= 256, "--concurrency must be in [1, 256]");
  opt.timeout_s = f.f64("timeout", 600);
  KILN_CHECK(opt.timeout_s > 0, "--timeout must be positive");
  opt.fewshot_path = f.str("fewshot");
  opt.model = pick_model(f, opt.base_url, opt.api, opt.api_key);
  const auto data = client::load_gsm8k(f.required("data"));
  std::vector<client::GsmRecord> previous;
  if (f.has("compare")) previous = client::load_records(f.str("compare"));

  const client::GsmResult r = client::run_gsm8k(opt, data);
  std::printf(
      "gsm8k: %zu questions, %d-shot, accuracy %.4f (%zu correct, %zu without a number, %zu errors)\n",
      r.records.size(), opt.shots, r.accuracy, r.correct, r.no_number, r.errors);
  if (f.has("out")) {
    std::string lines;
    for (const auto& rec : r.records) lines += client::record_to_json(rec).dump() + "\n";
    client::write_text_file(f.str("out"), lines);
  }
  if (f.has("compare")) {
    const auto flips = client::diff_records(previous, r.records);
    std::printf("compared with %s: %zu questions changed\n", f.str("compare").c_str(), flips.size());
    for (const auto& l : flips) std::printf("  %s\n", l.c_str());
  }
  return r.errors ? 3 : 0;
}

}  // namespace

KILN_COMMAND("eval reference",
             "greedy outputs and log-probs against a stored dump (agreement, divergence, drift)",
             run_eval_reference);
KILN_COMMAND("eval gsm8k", "GSM8K-format few-shot exact match with per-question records", run_eval_gsm8k);
