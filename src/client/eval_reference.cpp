#include "client/eval_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "kiln/error.h"

namespace kiln::client {

using json = nlohmann::json;
using TopList = std::vector<std::pair<std::string, double>>;

namespace {

// Best first; among equal logprobs the chosen token first, then the order given.
void sort_top(TopList& v, const std::string& chosen) {
  std::stable_sort(v.begin(), v.end(), [&](const auto& a, const auto& b) {
    if (a.second != b.second) return a.second > b.second;
    return a.first == chosen && b.first != chosen;
  });
}

// The best alternative other than `token` at one step; nullptr when there is none.
const std::pair<std::string, double>* best_other(const TopList& v, const std::string& token) {
  const std::pair<std::string, double>* best = nullptr;
  for (const auto& e : v)
    if (e.first != token && (!best || e.second > best->second)) best = &e;
  return best;
}

// `token`'s margin over its best other alternative at step k of r: its logprob (from the top list when
// it is there, else the record's) minus the other's; under greedy, top-1 minus top-2. NaN without top
// data or another alternative.
double margin_at(const RefRecord& r, size_t k, const std::string& token) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (k >= r.top.size() || k >= r.tokens.size() || r.tokens[k] != token) return nan;
  const auto* other = best_other(r.top[k], token);
  if (!other) return nan;
  double own = r.logprobs[k];
  for (const auto& e : r.top[k])
    if (e.first == token) {
      own = e.second;
      break;
    }
  return own - other->second;
}

}  // namespace

json dump_to_json(const RefDump& d) {
  json records = json::array();
  for (const auto& r : d.records) {
    json top = json::array();
    for (const auto& step : r.top) {
      json alts = json::array();
      for (const auto& [tok, lp] : step) alts.push_back(json::array({tok, lp}));
      top.push_back(std::move(alts));
    }
    records.push_back({{"prompt", r.prompt},
                       {"text", r.text},
                       {"tokens", r.tokens},
                       {"logprobs", r.logprobs},
                       {"top", std::move(top)}});
  }
  return {{"kind", "kiln-eval-reference"},
          {"version", 2},
          {"api", d.api},
          {"model", d.model},
          {"source", d.source},
          {"date_utc", d.date_utc},
          {"max_tokens", d.max_tokens},
          {"records", records}};
}

RefDump dump_from_json(const json& j) {
  KILN_CHECK(j.is_object() && j.value("kind", "") == "kiln-eval-reference", "not a kiln-eval-reference dump");
  const int version = j.contains("version") && j["version"].is_number_integer() ? j["version"].get<int>() : 0;
  KILN_CHECK(version == 1 || version == 2, "unsupported dump version ", j.value("version", json()).dump(),
             " (this kiln reads 1 and 2)");
  RefDump d;
  d.api = j.value("api", "completions");
  parse_api(d.api);
  d.model = j.value("model", "");
  d.source = j.value("source", "");
  d.date_utc = j.value("date_utc", "");
  KILN_CHECK(
      j.contains("max_tokens") && j["max_tokens"].is_number_integer() && j["max_tokens"].get<int64_t>() > 0,
      "dump needs a positive integer max_tokens");
  d.max_tokens = j["max_tokens"].get<int64_t>();
  KILN_CHECK(j.contains("records") && j["records"].is_array() && !j["records"].empty(),
             "dump holds no records");
  for (const auto& r : j["records"]) {
    RefRecord rec;
    KILN_CHECK(r.is_object() && r.contains("prompt") && r["prompt"].is_string(),
               "dump record without a prompt");
    rec.prompt = r["prompt"].get<std::string>();
    rec.text = r.value("text", "");
    KILN_CHECK(
        r.contains("tokens") && r["tokens"].is_array() && r.contains("logprobs") && r["logprobs"].is_array(),
        "dump record without tokens/logprobs");
    for (const auto& t : r["tokens"]) {
      KILN_CHECK(t.is_string(), "dump tokens must be strings");
      rec.tokens.push_back(t.get<std::string>());
    }
    for (const auto& l : r["logprobs"]) {
      KILN_CHECK(l.is_number(), "dump logprobs must be numbers");
      rec.logprobs.push_back(l.get<double>());
    }
    KILN_CHECK_EQ(rec.tokens.size(), rec.logprobs.size(), "in the record for prompt '",
                  rec.prompt.substr(0, 40), "'");
    if (version >= 2 && r.contains("top") && !r["top"].is_null()) {
      const std::string where = "dump record for prompt '" + rec.prompt.substr(0, 40) + "': ";
      const json& top = r["top"];
      KILN_CHECK(top.is_array(), where, "\"top\" must be a list (one list of [token, logprob] per token)");
      KILN_CHECK(top.empty() || top.size() == rec.tokens.size(), where, "\"top\" has ", top.size(),
                 " steps for ", rec.tokens.size(), " tokens");
      for (size_t k = 0; k < top.size(); ++k) {
        KILN_CHECK(top[k].is_array(), where, "top[", k, "] is not a list of [token, logprob]");
        TopList step;
        for (size_t e = 0; e < top[k].size(); ++e) {
          const json& x = top[k][e];
          KILN_CHECK(x.is_array() && x.size() == 2 && x[0].is_string() && x[1].is_number(), where, "top[", k,
                     "][", e, "] is not [token, logprob]: ", x.dump().substr(0, 60));
          step.emplace_back(x[0].get<std::string>(), x[1].get<double>());
        }
        sort_top(step, rec.tokens[k]);
        rec.top.push_back(std::move(step));
      }
    }
    d.records.push_back(std::move(rec));
  }
  return d;
}

RefDump load_dump(const std::string& path) {
  std::ifstream in(path);
  KILN_CHECK(in.good(), "cannot open dump '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  const json j = json::parse(ss.str(), nullptr, false);
  KILN_CHECK(!j.is_discarded(), "dump '", path, "' is not valid JSON");
  return dump_from_json(j);
}

std::vector<std::string> default_reference_prompts() {
  return {
      "The capital of France is",
      "def fibonacci(n):",
      "Water boils at a temperature of",
      "Once upon a time, in a small village by the sea,",
      "The three primary colors are",
      "To make a cup of tea, first",
      "Question: What is 12 times 7?\nAnswer:",
      "The quick brown fox",
      "import numpy as np\n\n# Compute the mean of an array\n",
      "In 1969, the first humans landed on",
      "A haiku about autumn:\n",
      "The chemical symbol for gold is",
      "SELECT name FROM users WHERE",
      "List three prime numbers greater than 10:",
      "Translate to French: Good morning, how are you?\n",
      "The largest planet in our solar system is",
  };
}

json greedy_request_body(Api api, const std::string& model, const std::string& prompt, int64_t max_tokens) {
  json body;
  if (api == Api::completions) {
    if (!model.empty()) body["model"] = model;
    body["prompt"] = prompt;
    body["max_tokens"] = max_tokens;
    body["temperature"] = 0;
    body["logprobs"] = kRefTopAlternatives;  // the chosen token's logprob and the top-2 per step
  } else {
    body["text"] = prompt;
    body["sampling_params"] = {{"max_new_tokens", max_tokens}, {"temperature", 0}};
    body["return_logprob"] = true;
    body["top_logprobs_num"] = kRefTopAlternatives;
  }
  return body;
}

namespace {

// choices[0].logprobs.top_logprobs[k]: OpenAI/vLLM/kiln give a {token: logprob} map (JSON objects do not
// keep order: sorted afterwards); also taken: a list of {"token", "logprob"} objects (the chat shape).
TopList completion_top_step(const json& s, size_t k) {
  TopList out;
  if (s.is_null()) return out;
  if (s.is_object()) {
    for (const auto& [tok, lp] : s.items()) {
      KILN_CHECK(lp.is_number(), "top_logprobs[", k, "]['", tok, "'] is not a number");
      out.emplace_back(tok, lp.get<double>());
    }
    return out;
  }
  KILN_CHECK(s.is_array(), "top_logprobs[", k, "] is neither a {token: logprob} map nor a list");
  for (const auto& e : s) {
    KILN_CHECK(e.is_object() && e.contains("token") && e["token"].is_string() && e.contains("logprob") &&
                   e["logprob"].is_number(),
               "top_logprobs[", k, "] entry is not {\"token\", \"logprob\"}: ", e.dump().substr(0, 60));
    out.emplace_back(e["token"].get<std::string>(), e["logprob"].get<double>());
  }
  return out;
}

// meta_info.output_top_logprobs[k]: SGLang/kiln give a list of [logprob, id, text-or-null]; null: none.
TopList generate_top_step(const json& s, size_t k) {
  TopList out;
  if (s.is_null()) return out;
  KILN_CHECK(s.is_array(), "output_top_logprobs[", k, "] is not a list of [logprob, id, ...]");
  for (const auto& e : s) {
    KILN_CHECK(e.is_array() && e.size() >= 2 && e[0].is_number() && e[1].is_number_integer(),
               "output_top_logprobs[", k, "] entry is not [logprob, id, ...]: ", e.dump().substr(0, 60));
    out.emplace_back(std::to_string(e[1].get<int64_t>()), e[0].get<double>());
  }
  return out;
}

}  // namespace

RefRecord record_from_response(Api api, const std::string& prompt, const json& response) {
  RefRecord rec;
  rec.prompt = prompt;
  json j = response;
  const json* top = nullptr;
  const char* top_name = "";
  if (api == Api::completions) {
    KILN_CHECK(j.is_object() && j.contains("choices") && j["choices"].is_array() && !j["choices"].empty(),
               "response has no choices");
    const json& c = j["choices"][0];
    rec.text = c.value("text", "");
    KILN_CHECK(c.contains("logprobs") && c["logprobs"].is_object(),
               "server returned no logprobs (asked logprobs: ", kRefTopAlternatives, ")");
    const json& lp = c["logprobs"];
    KILN_CHECK(lp.contains("tokens") && lp["tokens"].is_array() && lp.contains("token_logprobs") &&
                   lp["token_logprobs"].is_array() && lp["tokens"].size() == lp["token_logprobs"].size(),
               "logprobs lack matching tokens/token_logprobs arrays");
    for (size_t i = 0; i < lp["tokens"].size(); ++i) {
      const json& t = lp["tokens"][i];
      const json& l = lp["token_logprobs"][i];
      KILN_CHECK(t.is_string() && l.is_number(), "logprobs entry ", i, " is not (string, number)");
      rec.tokens.push_back(t.get<std::string>());
      rec.logprobs.push_back(l.get<double>());
    }
    if (lp.contains("top_logprobs") && !lp["top_logprobs"].is_null()) {
      top = &lp["top_logprobs"];
      top_name = "top_logprobs";
    }
  } else {
    if (j.is_array() && !j.empty()) j = j[0];
    KILN_CHECK(j.is_object(), "response is not a /generate object");
    rec.text = j.value("text", "");
    KILN_CHECK(j.contains("meta_info") && j["meta_info"].is_object() &&
                   j["meta_info"].contains("output_token_logprobs") &&
                   j["meta_info"]["output_token_logprobs"].is_array(),
               "server returned no meta_info.output_token_logprobs (asked return_logprob)");
    for (const auto& e : j["meta_info"]["output_token_logprobs"]) {
      KILN_CHECK(e.is_array() && e.size() >= 2 && e[0].is_number() && e[1].is_number_integer(),
                 "output_token_logprobs entry is not [logprob, id, ...]");
      rec.logprobs.push_back(e[0].get<double>());
      rec.tokens.push_back(std::to_string(e[1].get<int64_t>()));
    }
    const json& meta = j["meta_info"];
    if (meta.contains("output_top_logprobs") && !meta["output_top_logprobs"].is_null()) {
      top = &meta["output_top_logprobs"];
      top_name = "output_top_logprobs";
    }
  }
  if (top) {
    KILN_CHECK(top->is_array(), top_name, " is not a list (one entry per generated token)");
    KILN_CHECK(top->size() == rec.tokens.size(), top_name, " has ", top->size(), " steps for ",
               rec.tokens.size(), " tokens");
    bool any = false;
    for (size_t k = 0; k < top->size(); ++k) {
      TopList step =
          api == Api::completions ? completion_top_step((*top)[k], k) : generate_top_step((*top)[k], k);
      sort_top(step, rec.tokens[k]);
      any = any || !step.empty();
      rec.top.push_back(std::move(step));
    }
    if (!any) rec.top.clear();  // no alternatives at any step: no top data
  }
  return rec;
}

RefRecord query_greedy(HttpClient& http, Api api, const std::string& model, const std::string& prompt,
                       int64_t max_tokens) {
  const json body = greedy_request_body(api, model, prompt, max_tokens);
  const HttpResponse r =
      http.post_json(api == Api::completions ? "/v1/completions" : "/generate", body.dump());
  KILN_CHECK(r.error.empty(), "request failed: ", r.error);
  KILN_CHECK(r.status == 200, "HTTP ", r.status, ": ", r.body.substr(0, 300));
  const json j = json::parse(r.body, nullptr, false);
  KILN_CHECK(!j.is_discarded(), "response is not JSON: ", r.body.substr(0, 200));
  return record_from_response(api, prompt, j);
}

ReferenceReport compare_dumps(const RefDump& ref, const RefDump& got, double tie_margin) {
  KILN_CHECK(tie_margin >= 0, "the tie margin must be >= 0, got ", tie_margin);
  KILN_CHECK_EQ(ref.records.size(), got.records.size(), "dumps hold different prompt counts");
  KILN_CHECK(ref.api == got.api, "dumps were taken through different APIs (", ref.api, " vs ", got.api,
             "): their tokens do not compare");
  ReferenceReport out;
  out.prompts = ref.records.size();
  out.tie_margin = tie_margin;
  size_t matched_total = 0, ref_total = 0, drift_n = 0;
  double drift_sum = 0;
  for (size_t i = 0; i < ref.records.size(); ++i) {
    const RefRecord& a = ref.records[i];
    const RefRecord& b = got.records[i];
    KILN_CHECK(a.prompt == b.prompt, "prompt ", i, " differs between the dumps");
    PromptComparison c;
    c.index = i;
    c.ref_tokens = a.tokens.size();
    c.got_tokens = b.tokens.size();
    const size_t common = std::min(a.tokens.size(), b.tokens.size());
    size_t k = 0;
    while (k < common && a.tokens[k] == b.tokens[k]) ++k;
    if (k < common || a.tokens.size() != b.tokens.size()) {
      c.first_divergence = int64_t(k);
      c.ref_token = k < a.tokens.size() ? a.tokens[k] : "";
      c.got_token = k < b.tokens.size() ? b.tokens[k] : "";
      if (k < a.tokens.size() && k < a.top.size()) {
        const auto* runner_up = best_other(a.top[k], c.ref_token);
        c.ref_margin = margin_at(a, k, c.ref_token);
        c.got_was_runner_up = runner_up && k < b.tokens.size() && runner_up->first == c.got_token;
        c.near_tie = c.got_was_runner_up && !std::isnan(c.ref_margin) && c.ref_margin <= tie_margin;
      }
      if (k < b.tokens.size()) c.got_margin = margin_at(b, k, c.got_token);
      if (c.near_tie) {
        ++out.near_tie_divergences;
      } else {
        ++out.other_divergences;
        if (std::isnan(c.ref_margin)) ++out.unknown_margin;
      }
    } else {
      ++out.identical;
    }
    double sum = 0;
    for (size_t p = 0; p < k; ++p) {
      const double d = std::fabs(a.logprobs[p] - b.logprobs[p]);
      c.max_abs_drift = std::max(c.max_abs_drift, d);
      sum += d;
    }
    c.mean_abs_drift = k ? sum / double(k) : 0;
    drift_sum += sum;
    drift_n += k;
    out.max_abs_drift = std::max(out.max_abs_drift, c.max_abs_drift);
    matched_total += k;
    ref_total += a.tokens.size();
    out.per_prompt.push_back(c);
  }
  out.agreement_rate = out.prompts ? double(out.identical) / double(out.prompts) : 0;
  out.token_agreement = ref_total ? double(matched_total) / double(ref_total) : 1;
  out.mean_abs_drift = drift_n ? drift_sum / double(drift_n) : 0;
  return out;
}

json report_to_json(const ReferenceReport& r) {
  json per = json::array();
  for (const auto& c : r.per_prompt)
    per.push_back({{"index", c.index},
                   {"first_divergence", c.first_divergence},
                   {"ref_tokens", c.ref_tokens},
                   {"got_tokens", c.got_tokens},
                   {"ref_token", c.ref_token},
                   {"got_token", c.got_token},
                   {"max_abs_logprob_drift", c.max_abs_drift},
                   {"mean_abs_logprob_drift", c.mean_abs_drift},
                   {"ref_margin", std::isnan(c.ref_margin) ? json(nullptr) : json(c.ref_margin)},
                   {"got_margin", std::isnan(c.got_margin) ? json(nullptr) : json(c.got_margin)},
                   {"got_was_runner_up", c.got_was_runner_up},
                   {"near_tie", c.near_tie}});
  return {{"prompts", r.prompts},
          {"identical", r.identical},
          {"agreement_rate", r.agreement_rate},
          {"token_agreement", r.token_agreement},
          {"mean_abs_logprob_drift", r.mean_abs_drift},
          {"max_abs_logprob_drift", r.max_abs_drift},
          {"tie_margin", r.tie_margin},
          {"near_tie_divergences", r.near_tie_divergences},
          {"other_divergences", r.other_divergences},
          {"unknown_margin_divergences", r.unknown_margin},
          {"per_prompt", per}};
}

std::string near_tie_summary(const ReferenceReport& r) {
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "divergences: %zu at near ties (margin <= %g, the other run's token was the runner-up), %zu other",
      r.near_tie_divergences, r.tie_margin, r.other_divergences);
  std::string s = buf;
  if (r.unknown_margin) {
    std::snprintf(buf, sizeof buf, " (%zu without the reference's top-2 data)", r.unknown_margin);
    s += buf;
  }
  return s;
}

}  // namespace kiln::client
