#include "client/gsm8k.h"

#include <cctype>
#include <fstream>
#include <map>

#include "client/pool.h"
#include "kiln/error.h"

namespace kiln::client {

using json = nlohmann::json;

std::vector<GsmItem> load_gsm8k(const std::string& path) {
  std::ifstream in(path);
  KILN_CHECK(in.good(), "cannot open GSM8K data '", path, "'");
  std::vector<GsmItem> out;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, false);
    KILN_CHECK(!j.is_discarded() && j.is_object(), path, ":", lineno, ": not a JSON object");
    KILN_CHECK(j.contains("question") && j["question"].is_string() && j.contains("answer") &&
                   j["answer"].is_string(),
               path, ":", lineno, ": needs string fields \"question\" and \"answer\"");
    out.push_back({j["question"].get<std::string>(), j["answer"].get<std::string>()});
  }
  KILN_CHECK(!out.empty(), "GSM8K data '", path, "' holds no questions");
  return out;
}

std::string normalize_number(const std::string& s) {
  std::string t;
  for (char c : s)
    if (c != ',') t += c;
  bool neg = false;
  if (!t.empty() && (t[0] == '-' || t[0] == '+')) {
    neg = t[0] == '-';
    t.erase(0, 1);
  }
  if (const size_t dot = t.find('.'); dot != std::string::npos) {
    while (!t.empty() && t.back() == '0') t.pop_back();
    if (!t.empty() && t.back() == '.') t.pop_back();
  }
  size_t lead = 0;
  while (lead + 1 < t.size() && t[lead] == '0' && t[lead + 1] != '.') ++lead;
  t.erase(0, lead);
  if (t.empty() || t == "0") return "0";
  return neg ? "-" + t : t;
}

// Every number in text: an optional '-', a digit, digits or commas, an optional '.' with digits.
static std::vector<std::string> numbers(const std::string& text) {
  std::vector<std::string> out;
  const auto digit = [&](size_t i) {
    return i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]));
  };
  for (size_t i = 0; i < text.size();) {
    if (!digit(i)) {
      ++i;
      continue;
    }
    size_t start = i;
    if (start > 0 && text[start - 1] == '-') --start;
    size_t j = i;
    while (digit(j) || (j < text.size() && text[j] == ',' && digit(j + 1))) ++j;
    if (j < text.size() && text[j] == '.' && digit(j + 1)) {
      ++j;
      while (digit(j)) ++j;
    }
    out.push_back(normalize_number(text.substr(start, j - start)));
    i = j;
  }
  return out;
}

std::string last_number(const std::string& text) {
  const auto all = numbers(text);
  return all.empty() ? "" : all.back();
}

std::string reference_answer(const std::string& answer) {
  const size_t pos = answer.rfind("####");
  if (pos == std::string::npos) return "";
  const auto all = numbers(answer.substr(pos + 4));
  return all.empty() ? "" : all.front();
}

std::string fewshot_prompt(const std::vector<GsmItem>& shots, const std::string& question) {
  std::string p;
  for (const auto& s : shots) p += "Question: " + s.question + "\nAnswer: " + s.answer + "\n\n";
  p += "Question: " + question + "\nAnswer:";
  return p;
}

json record_to_json(const GsmRecord& r) {
  json j = {{"index", r.index},           {"question", r.question}, {"reference", r.reference},
            {"prediction", r.prediction}, {"correct", r.correct},   {"output", r.output}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

GsmRecord record_from_json(const json& j) {
  KILN_CHECK(j.is_object() && j.contains("index") && j["index"].is_number_unsigned() &&
                 j.contains("correct") && j["correct"].is_boolean(),
             "not a GSM8K record (needs index and correct)");
  GsmRecord r;
  r.index = j["index"].get<size_t>();
  r.correct = j["correct"].get<bool>();
  r.question = j.value("question", "");
  r.reference = j.value("reference", "");
  r.prediction = j.value("prediction", "");
  r.output = j.value("output", "");
  r.error = j.value("error", "");
  return r;
}

std::vector<GsmRecord> load_records(const std::string& path) {
  std::ifstream in(path);
  KILN_CHECK(in.good(), "cannot open records '", path, "'");
  std::vector<GsmRecord> out;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    KILN_CHECK(!j.is_discarded(), path, ":", lineno, ": not JSON");
    out.push_back(record_from_json(j));
  }
  return out;
}

static std::string complete(HttpClient& http, const GsmOptions& opt, const std::string& prompt) {
  const json stop = json::array({"Question", "</s>", "<|im_end|>"});
  json body;
  if (opt.api == Api::completions) {
    body = {{"prompt", prompt}, {"max_tokens", opt.max_tokens}, {"temperature", 0}, {"stop", stop}};
    if (!opt.model.empty()) body["model"] = opt.model;
  } else {
    body = {{"text", prompt},
            {"sampling_params", {{"max_new_tokens", opt.max_tokens}, {"temperature", 0}, {"stop", stop}}}};
  }
  const HttpResponse r =
      http.post_json(opt.api == Api::completions ? "/v1/completions" : "/generate", body.dump());
  KILN_CHECK(r.error.empty(), "request failed: ", r.error);
  KILN_CHECK(r.status == 200, "HTTP ", r.status, ": ", r.body.substr(0, 300));
  json j = json::parse(r.body, nullptr, false);
  KILN_CHECK(!j.is_discarded(), "response is not JSON");
  if (opt.api == Api::completions) {
    KILN_CHECK(j.contains("choices") && j["choices"].is_array() && !j["choices"].empty() &&
                   j["choices"][0].contains("text") && j["choices"][0]["text"].is_string(),
               "response has no choices[0].text");
    return j["choices"][0]["text"].get<std::string>();
  }
  if (j.is_array() && !j.empty()) j = j[0];
  KILN_CHECK(j.contains("text") && j["text"].is_string(), "response has no text");
  return j["text"].get<std::string>();
}

GsmResult run_gsm8k(const GsmOptions& opt, const std::vector<GsmItem>& data) {
  KILN_CHECK(opt.shots >= 0, "--shots must be >= 0");
  KILN_CHECK(opt.max_tokens > 0, "--max-tokens must be positive");
  std::vector<GsmItem> shots;
  size_t first = 0;
  if (!opt.fewshot_path.empty()) {
    const auto pool = load_gsm8k(opt.fewshot_path);
    KILN_CHECK(pool.size() >= size_t(opt.shots), "few-shot file has ", pool.size(), " examples, asked ",
               opt.shots);
    shots.assign(pool.begin(), pool.begin() + opt.shots);
  } else {
    KILN_CHECK(data.size() > size_t(opt.shots), "data has ", data.size(),
               " questions: need more than --shots ", opt.shots,
               " (the first ones are the examples; or pass --fewshot FILE)");
    shots.assign(data.begin(), data.begin() + opt.shots);
    first = size_t(opt.shots);
  }
  size_t n = data.size() - first;
  if (opt.limit >= 0) n = std::min(n, size_t(opt.limit));
  GsmResult out;
  out.records.resize(n);
  parallel_requests(
      opt.base_url, opt.timeout_s, opt.api_key, n, opt.concurrency, [&](HttpClient& http, size_t i) {
        const GsmItem& item = data[first + i];
        GsmRecord& rec = out.records[i];
        rec.index = first + i;
        rec.question = item.question;
        rec.reference = reference_answer(item.answer);
        KILN_CHECK(!rec.reference.empty(), "question ", rec.index, ": its answer has no '#### <number>'");
        try {
          rec.output = complete(http, opt, fewshot_prompt(shots, item.question));
        } catch (const std::exception& e) {
          rec.error = e.what();
        }
        rec.prediction = last_number(rec.output);
        rec.correct = rec.error.empty() && rec.prediction == rec.reference;
      });
  for (const auto& r : out.records) {
    out.correct += r.correct;
    out.errors += !r.error.empty();
    out.no_number += r.error.empty() && r.prediction.empty();
  }
  out.accuracy = n ? double(out.correct) / double(n) : 0;
  return out;
}

std::vector<std::string> diff_records(const std::vector<GsmRecord>& a, const std::vector<GsmRecord>& b) {
  std::map<size_t, const GsmRecord*> by_index;
  for (const auto& r : b) by_index[r.index] = &r;
  std::vector<std::string> out;
  for (const auto& r : a) {
    auto it = by_index.find(r.index);
    if (it == by_index.end() || it->second->correct == r.correct) continue;
    out.push_back("question " + std::to_string(r.index) + ": " +
                  (r.correct ? "right -> wrong" : "wrong -> right") + " (reference " + r.reference +
                  ", predictions " + (r.prediction.empty() ? "none" : r.prediction) + " -> " +
                  (it->second->prediction.empty() ? "none" : it->second->prediction) + ")");
  }
  return out;
}

}  // namespace kiln::client
