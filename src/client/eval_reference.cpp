#include "client/eval_reference.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "kiln/error.h"

namespace kiln::client {

using json = nlohmann::json;

json dump_to_json(const RefDump& d) {
  json records = json::array();
  for (const auto& r : d.records)
    records.push_back(
        {{"prompt", r.prompt}, {"text", r.text}, {"tokens", r.tokens}, {"logprobs", r.logprobs}});
  return {{"kind", "kiln-eval-reference"},
          {"version", 1},
          {"api", d.api},
          {"model", d.model},
          {"source", d.source},
          {"date_utc", d.date_utc},
          {"max_tokens", d.max_tokens},
          {"records", records}};
}

RefDump dump_from_json(const json& j) {
  KILN_CHECK(j.is_object() && j.value("kind", "") == "kiln-eval-reference", "not a kiln-eval-reference dump");
  KILN_CHECK(j.value("version", 0) == 1, "unsupported dump version ", j.value("version", 0));
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

RefRecord query_greedy(HttpClient& http, Api api, const std::string& model, const std::string& prompt,
                       int64_t max_tokens) {
  RefRecord rec;
  rec.prompt = prompt;
  json body;
  if (api == Api::completions) {
    if (!model.empty()) body["model"] = model;
    body["prompt"] = prompt;
    body["max_tokens"] = max_tokens;
    body["temperature"] = 0;
    body["logprobs"] = 1;
  } else {
    body["text"] = prompt;
    body["sampling_params"] = {{"max_new_tokens", max_tokens}, {"temperature", 0}};
    body["return_logprob"] = true;
  }
  const HttpResponse r =
      http.post_json(api == Api::completions ? "/v1/completions" : "/generate", body.dump());
  KILN_CHECK(r.error.empty(), "request failed: ", r.error);
  KILN_CHECK(r.status == 200, "HTTP ", r.status, ": ", r.body.substr(0, 300));
  json j = json::parse(r.body, nullptr, false);
  KILN_CHECK(!j.is_discarded(), "response is not JSON: ", r.body.substr(0, 200));
  if (api == Api::completions) {
    KILN_CHECK(j.contains("choices") && j["choices"].is_array() && !j["choices"].empty(),
               "response has no choices");
    const json& c = j["choices"][0];
    rec.text = c.value("text", "");
    KILN_CHECK(c.contains("logprobs") && c["logprobs"].is_object(),
               "server returned no logprobs (asked logprobs: 1)");
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
  } else {
    if (j.is_array() && !j.empty()) j = j[0];
    rec.text = j.value("text", "");
    KILN_CHECK(j.contains("meta_info") && j["meta_info"].contains("output_token_logprobs") &&
                   j["meta_info"]["output_token_logprobs"].is_array(),
               "server returned no meta_info.output_token_logprobs (asked return_logprob)");
    for (const auto& e : j["meta_info"]["output_token_logprobs"]) {
      KILN_CHECK(e.is_array() && e.size() >= 2 && e[0].is_number() && e[1].is_number_integer(),
                 "output_token_logprobs entry is not [logprob, id, ...]");
      rec.logprobs.push_back(e[0].get<double>());
      rec.tokens.push_back(std::to_string(e[1].get<int64_t>()));
    }
  }
  return rec;
}

ReferenceReport compare_dumps(const RefDump& ref, const RefDump& got) {
  KILN_CHECK_EQ(ref.records.size(), got.records.size(), "dumps hold different prompt counts");
  KILN_CHECK(ref.api == got.api, "dumps were taken through different APIs (", ref.api, " vs ", got.api,
             "): their tokens do not compare");
  ReferenceReport out;
  out.prompts = ref.records.size();
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
                   {"mean_abs_logprob_drift", c.mean_abs_drift}});
  return {{"prompts", r.prompts},
          {"identical", r.identical},
          {"agreement_rate", r.agreement_rate},
          {"token_agreement", r.token_agreement},
          {"mean_abs_logprob_drift", r.mean_abs_drift},
          {"max_abs_logprob_drift", r.max_abs_drift},
          {"per_prompt", per}};
}

}  // namespace kiln::client
