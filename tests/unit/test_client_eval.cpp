// Answer extraction and records for GSM8K, dump comparison for eval reference, deterministic workloads.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>

#include "client/eval_reference.h"
#include "client/gsm8k.h"
#include "client/workload.h"
#include "kiln/error.h"

using namespace kiln::client;

namespace {
std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = std::string(KILN_BINARY_DIR) + "/" + name;
  std::ofstream(path) << text;
  return path;
}
}  // namespace

TEST(ClientGsm8k, NormalizesNumbers) {
  EXPECT_EQ(normalize_number("1,234"), "1234");
  EXPECT_EQ(normalize_number("1234.50"), "1234.5");
  EXPECT_EQ(normalize_number("18.00"), "18");
  EXPECT_EQ(normalize_number("007"), "7");
  EXPECT_EQ(normalize_number("0.5"), "0.5");
  EXPECT_EQ(normalize_number("-0"), "0");
  EXPECT_EQ(normalize_number("-12"), "-12");
}

TEST(ClientGsm8k, ExtractsTheLastNumberOfAnOutput) {
  EXPECT_EQ(last_number(" She pays 3 * $4 = $12.\nSo the total is $1,234.50."), "1234.5");
  EXPECT_EQ(last_number("It is -5 degrees, then 7."), "7");
  EXPECT_EQ(last_number("It drops to -5"), "-5");
  EXPECT_EQ(last_number("18."), "18");
  EXPECT_EQ(last_number("no digits here"), "");
  EXPECT_EQ(last_number("3,4"), "34");          // a comma between digits is a thousands separator
  EXPECT_EQ(last_number("apples: 3, 4"), "4");  // ", " separates numbers
}

TEST(ClientGsm8k, ReferenceIsTheNumberAfterHashes) {
  EXPECT_EQ(reference_answer("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"), "72");
  EXPECT_EQ(reference_answer("... #### 1,000"), "1000");
  EXPECT_EQ(reference_answer("#### -3.50"), "-3.5");
  EXPECT_EQ(reference_answer("The answer is 5"), "");
}

TEST(ClientGsm8k, FewShotPromptFormat) {
  const std::vector<GsmItem> shots = {{"q1?", "a1\n#### 1"}, {"q2?", "a2\n#### 2"}};
  EXPECT_EQ(
      fewshot_prompt(shots, "q3?"),
      "Question: q1?\nAnswer: a1\n#### 1\n\nQuestion: q2?\nAnswer: a2\n#### 2\n\nQuestion: q3?\nAnswer:");
  EXPECT_EQ(fewshot_prompt({}, "q"), "Question: q\nAnswer:");
}

TEST(ClientGsm8k, LoadsDataAndRejectsMalformedLines) {
  const auto ok = load_gsm8k(temp_file("gsm_ok.jsonl", R"({"question":"a","answer":"#### 1"}

{"question":"b","answer":"#### 2"}
)"));
  ASSERT_EQ(ok.size(), 2u);
  EXPECT_EQ(ok[1].question, "b");
  EXPECT_THROW(load_gsm8k(temp_file("gsm_bad.jsonl", "{\"question\":\"a\"}\n")), kiln::Error);
  EXPECT_THROW(load_gsm8k(temp_file("gsm_bad2.jsonl", "not json\n")), kiln::Error);
  EXPECT_THROW(load_gsm8k(temp_file("gsm_empty.jsonl", "")), kiln::Error);
  EXPECT_THROW(load_gsm8k("/nonexistent/gsm.jsonl"), kiln::Error);
}

TEST(ClientGsm8k, RecordsRoundTripAndDiff) {
  GsmRecord a{3, "q", "72", "72", " so 72", "", true};
  const GsmRecord back = record_from_json(record_to_json(a));
  EXPECT_EQ(back.index, 3u);
  EXPECT_TRUE(back.correct);
  EXPECT_EQ(back.prediction, "72");
  GsmRecord b = a;
  b.correct = false;
  b.prediction = "";
  GsmRecord same{4, "q4", "1", "1", "1", "", true};
  const auto flips = diff_records({a, same}, {b, same});
  ASSERT_EQ(flips.size(), 1u);
  EXPECT_NE(flips[0].find("question 3: right -> wrong"), std::string::npos) << flips[0];
  EXPECT_NE(flips[0].find("72 -> none"), std::string::npos) << flips[0];
  EXPECT_THROW(record_from_json({{"question", "x"}}), kiln::Error);
}

namespace {
RefDump dump_of(std::vector<std::vector<std::string>> toks, std::vector<std::vector<double>> lps) {
  RefDump d;
  d.api = "completions";
  d.max_tokens = 4;
  for (size_t i = 0; i < toks.size(); ++i)
    d.records.push_back({"p" + std::to_string(i), "", toks[i], lps[i]});
  return d;
}
}  // namespace

TEST(ClientEvalReference, ComparesAgreementDivergenceAndDrift) {
  const RefDump ref = dump_of({{"a", "b", "c", "d"}, {"x", "y"}, {"m", "n"}},
                              {{-0.1, -0.2, -0.3, -0.4}, {-1.0, -2.0}, {-0.5, -0.5}});
  const RefDump got = dump_of({{"a", "b", "Z", "d"}, {"x", "y"}, {"m", "n", "o"}},
                              {{-0.15, -0.2, -9.0, -0.4}, {-1.0, -2.0}, {-0.5, -0.7, -1.0}});
  const ReferenceReport r = compare_dumps(ref, got);
  EXPECT_EQ(r.prompts, 3u);
  EXPECT_EQ(r.identical, 1u);
  EXPECT_NEAR(r.agreement_rate, 1.0 / 3, 1e-12);
  ASSERT_EQ(r.per_prompt.size(), 3u);
  EXPECT_EQ(r.per_prompt[0].first_divergence, 2);
  EXPECT_EQ(r.per_prompt[0].ref_token, "c");
  EXPECT_EQ(r.per_prompt[0].got_token, "Z");
  EXPECT_NEAR(r.per_prompt[0].max_abs_drift, 0.05, 1e-12);  // only positions before the divergence count
  EXPECT_NEAR(r.per_prompt[0].mean_abs_drift, 0.025, 1e-12);
  EXPECT_EQ(r.per_prompt[1].first_divergence, -1);
  EXPECT_EQ(r.per_prompt[2].first_divergence, 2);  // the candidate runs on past the reference's end
  EXPECT_EQ(r.per_prompt[2].ref_token, "");
  EXPECT_NEAR(r.per_prompt[2].max_abs_drift, 0.2, 1e-12);
  EXPECT_NEAR(r.max_abs_drift, 0.2, 1e-12);
  EXPECT_NEAR(r.token_agreement, 6.0 / 8, 1e-12);  // 2 + 2 + 2 matched of 4 + 2 + 2
  EXPECT_NEAR(r.mean_abs_drift, (0.05 + 0 + 0 + 0 + 0 + 0.2) / 6, 1e-12);
}

TEST(ClientEvalReference, DumpRoundTripAndErrors) {
  RefDump d = dump_of({{"a", "b"}}, {{-0.5, -0.25}});
  d.model = "m";
  const RefDump back = dump_from_json(dump_to_json(d));
  ASSERT_EQ(back.records.size(), 1u);
  EXPECT_EQ(back.records[0].tokens, d.records[0].tokens);
  EXPECT_EQ(back.records[0].logprobs, d.records[0].logprobs);
  EXPECT_EQ(back.model, "m");
  auto j = dump_to_json(d);
  j["records"][0]["logprobs"] = {-0.5};
  EXPECT_THROW(dump_from_json(j), kiln::Error);  // tokens and logprobs differ in length
  EXPECT_THROW(dump_from_json({{"kind", "something else"}}), kiln::Error);
  RefDump other = d;
  other.api = "generate";
  EXPECT_THROW(compare_dumps(d, other), kiln::Error);
  other = d;
  other.records[0].prompt = "changed";
  EXPECT_THROW(compare_dumps(d, other), kiln::Error);
}

TEST(ClientWorkload, RandomPromptsAreDeterministicAndInRange) {
  Workload w;
  w.input_len = 64;
  w.output_len = 8;
  w.seed = 3;
  w.vocab_lo = 100;
  w.vocab_hi = 200;
  const auto a = make_requests(w, 16, 10), b = make_requests(w, 16, 12), c = make_requests(w, 17, 10);
  std::set<int32_t> seen;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].input_ids, b[i].input_ids);  // prompt i depends on (seed, tag, i) only
    EXPECT_NE(a[i].input_ids, c[i].input_ids);
    EXPECT_EQ(a[i].input_ids.size(), 64u);
    EXPECT_EQ(a[i].expected_input, 64);
    EXPECT_EQ(a[i].output_len, 8);
    for (int32_t id : a[i].input_ids) {
      EXPECT_GE(id, 100);
      EXPECT_LT(id, 200);
      seen.insert(id);
    }
  }
  EXPECT_GT(seen.size(), 90u);  // 640 draws cover nearly all of the 100 ids
  EXPECT_NE(a[0].input_ids, a[1].input_ids);
  w.seed = 4;
  EXPECT_NE(make_requests(w, 16, 1)[0].input_ids, a[0].input_ids);
}

TEST(ClientWorkload, TextPromptsFromAFile) {
  const auto prompts = load_prompts(
      temp_file("prompts.txt", "Hello there\n\n{\"prompt\": \"json one\", \"input_tokens\": 3}\n"));
  ASSERT_EQ(prompts.size(), 2u);
  EXPECT_EQ(prompts[0].text, "Hello there");
  EXPECT_EQ(prompts[0].input_tokens, -1);
  EXPECT_EQ(prompts[1].text, "json one");
  EXPECT_EQ(prompts[1].input_tokens, 3);
  Workload w;
  w.texts = prompts;
  w.output_len = 5;
  const auto reqs = make_requests(w, 1, 5);
  for (const auto& r : reqs) {
    EXPECT_TRUE(r.input_ids.empty());
    EXPECT_TRUE(r.text == "Hello there" || r.text == "json one");
    EXPECT_EQ(r.expected_input, r.text == "json one" ? 3 : -1);
  }
  EXPECT_THROW(load_prompts(temp_file("prompts_bad.txt", "{\"prompt\": 5}\n")), kiln::Error);
  EXPECT_THROW(load_prompts(temp_file("prompts_empty.txt", "\n\n")), kiln::Error);
  EXPECT_THROW(load_prompts(temp_file("prompts_utf8.txt", "ok\nbad \xff byte\n")), kiln::Error);
}
