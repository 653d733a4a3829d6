// `kiln eval gsm8k`: GSM8K-format few-shot exact match. Data: JSONL lines {"question": ..., "answer": ...}
// where the answer ends with "#### <number>" (the GSM8K convention). No dataset ships with kiln.
// Prompt: k solved examples "Question: q\nAnswer: a\n\n", then "Question: q\nAnswer:"; greedy
// (temperature 0), stop at "Question". The prediction is the last number in the output; both sides are
// normalised (commas dropped, trailing fractional zeros dropped) and compared as strings.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/request.h"

namespace kiln::client {

struct GsmItem {
  std::string question, answer;
};
std::vector<GsmItem> load_gsm8k(const std::string& path);  // clear errors on malformed lines

std::string normalize_number(const std::string& s);       // "1,234.50" -> "1234.5"; "-0" -> "0"
std::string last_number(const std::string& text);         // normalised, "" when the text holds none
std::string reference_answer(const std::string& answer);  // the number after "####", "" when absent

std::string fewshot_prompt(const std::vector<GsmItem>& shots, const std::string& question);

struct GsmRecord {
  size_t index = 0;  // position in the data file
  std::string question, reference, prediction, output, error;
  bool correct = false;
};
nlohmann::json record_to_json(const GsmRecord& r);
GsmRecord record_from_json(const nlohmann::json& j);
std::vector<GsmRecord> load_records(const std::string& path);

struct GsmOptions {
  std::string base_url, api_key, model;
  Api api = Api::completions;
  int shots = 5;
  int64_t limit = -1;  // questions to evaluate; -1: all
  int64_t max_tokens = 256;
  int concurrency = 8;
  double timeout_s = 600;
  std::string fewshot_path;  // shots from this file; otherwise the first `shots` items of the data
};

struct GsmResult {
  std::vector<GsmRecord> records;
  size_t correct = 0, no_number = 0, errors = 0;
  double accuracy = 0;  // correct / records
};
GsmResult run_gsm8k(const GsmOptions& opt, const std::vector<GsmItem>& data);

// Questions (by data index) whose correctness differs between two runs, one line each.
std::vector<std::string> diff_records(const std::vector<GsmRecord>& a, const std::vector<GsmRecord>& b);

}  // namespace kiln::client
