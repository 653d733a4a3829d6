// Answer extraction and records for GSM8K, dump comparison for eval reference, deterministic workloads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include "client/eval_reference.h"
#include "client/gsm8k.h"
#include "client/workload.h"
#include "common/test_support.h"
#include "kiln/error.h"

using namespace kiln::client;

namespace {
std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = (kiln::test_support::process_scratch_dir("client_eval") / name).string();
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

namespace {
using Top = std::vector<std::pair<std::string, double>>;
// A one-prompt dump whose step k has the given alternatives (an empty list: no alternatives there).
RefDump dump_with_top(std::vector<std::string> toks, std::vector<double> lps, std::vector<Top> top) {
  RefDump d = dump_of({std::move(toks)}, {std::move(lps)});
  d.records[0].top = std::move(top);
  return d;
}
}  // namespace

TEST(ClientEvalReference, DumpV2RoundTripKeepsTopAlternatives) {
  RefDump d = dump_with_top({"a", "b"}, {-0.5, -0.25}, {{{"a", -0.5}, {"x", -1.5}}, {{"b", -0.25}}});
  const auto j = dump_to_json(d);
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["records"][0]["top"][0][1][0], "x");
  const RefDump back = dump_from_json(j);
  ASSERT_EQ(back.records[0].top.size(), 2u);
  EXPECT_EQ(back.records[0].top[0], (Top{{"a", -0.5}, {"x", -1.5}}));
  EXPECT_EQ(back.records[0].top[1], (Top{{"b", -0.25}}));  // a server that gave one alternative
  // A record without top data stays without it (stored as an empty list).
  const RefDump plain = dump_from_json(dump_to_json(dump_of({{"a"}}, {{-0.1}})));
  EXPECT_TRUE(plain.records[0].top.empty());
  // Lists are sorted best first when loaded, whatever order the file holds.
  auto shuffled = j;
  shuffled["records"][0]["top"][0] = nlohmann::json::parse(R"([["x", -1.5], ["a", -0.5]])");
  EXPECT_EQ(dump_from_json(shuffled).records[0].top[0], (Top{{"a", -0.5}, {"x", -1.5}}));
}

TEST(ClientEvalReference, DumpV1StillLoads) {
  const auto j = nlohmann::json::parse(R"({"kind": "kiln-eval-reference", "version": 1, "api": "completions",
    "model": "m", "source": "http://x", "date_utc": "2026-11-01T00:00:00Z", "max_tokens": 2,
    "records": [{"prompt": "p0", "text": "ab", "tokens": ["a", "b"], "logprobs": [-0.5, -0.25]}]})");
  const RefDump v1 = dump_from_json(j);
  ASSERT_EQ(v1.records.size(), 1u);
  EXPECT_EQ(v1.records[0].tokens, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(v1.records[0].top.empty());
  // A v1 reference against a v2 candidate: divergences compare, their margins are unknown.
  RefDump got =
      dump_with_top({"a", "c"}, {-0.5, -0.3}, {{{"a", -0.5}, {"b", -0.6}}, {{"c", -0.3}, {"b", -0.31}}});
  got.records[0].prompt = "p0";
  const ReferenceReport r = compare_dumps(v1, got);
  EXPECT_EQ(r.per_prompt[0].first_divergence, 1);
  EXPECT_TRUE(std::isnan(r.per_prompt[0].ref_margin));
  EXPECT_FALSE(r.per_prompt[0].near_tie);
  EXPECT_NEAR(r.per_prompt[0].got_margin, 0.01, 1e-12);  // the candidate's own top-1 minus top-2
  EXPECT_EQ(r.other_divergences, 1u);
  EXPECT_EQ(r.unknown_margin, 1u);
  auto v3 = j;
  v3["version"] = 3;
  EXPECT_THROW(dump_from_json(v3), kiln::Error);
}

TEST(ClientEvalReference, MalformedTopDataIsAClearError) {
  const auto good = dump_to_json(dump_with_top({"a", "b"}, {-0.5, -0.25}, {{{"a", -0.5}}, {{"b", -0.25}}}));
  auto expect_error = [](nlohmann::json j, const std::string& needle) {
    try {
      dump_from_json(j);
      ADD_FAILURE() << "no error for " << j["records"][0]["top"].dump();
    } catch (const kiln::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("p0"), std::string::npos) << e.what();  // names the record
    }
  };
  auto j = good;
  j["records"][0]["top"] = nlohmann::json::parse(R"([[["a", -0.5]]])");  // one step for two tokens
  expect_error(j, "1 steps for 2 tokens");
  j = good;
  j["records"][0]["top"] = "a";
  expect_error(j, "must be a list");
  j = good;
  j["records"][0]["top"][1] = nlohmann::json::parse(R"([["b", "not a number"]])");
  expect_error(j, "top[1][0] is not [token, logprob]");
  j = good;
  j["records"][0]["top"][0] = nlohmann::json::parse(R"([{"token": "a", "logprob": -0.5}])");  // not a pair
  expect_error(j, "top[0][0] is not [token, logprob]");
  j = good;
  j["records"][0]["top"][1] = 5;
  expect_error(j, "top[1] is not a list");
  j = good;
  j["records"][0]["top"][0] = nlohmann::json::parse(R"([["a", -0.5, 1]])");  // three entries
  expect_error(j, "top[0][0]");
}

TEST(ClientEvalReference, ClassifiesDivergencesAsNearTiesOrOther) {
  // Four prompts, each diverging at step 1; the reference's alternatives at that step decide.
  RefDump ref, got;
  ref.api = got.api = "completions";
  ref.max_tokens = got.max_tokens = 2;
  auto add = [&](const std::string& ref_tok, Top top, const std::string& got_tok) {
    const std::string p = "p" + std::to_string(ref.records.size());
    RefRecord a{p, "", {"s", ref_tok}, {-0.1, top.empty() ? -1.0 : top[0].second}, {}};
    if (!top.empty()) a.top = {{{"s", -0.1}, {"t", -3.0}}, top};
    ref.records.push_back(a);
    got.records.push_back({p, "", {"s", got_tok}, {-0.1, -1.0}, {}});
  };
  add("x", {{"x", -0.70}, {"y", -0.72}}, "y");  // runner-up, margin 0.02: near tie
  add("x", {{"x", -0.20}, {"y", -2.20}}, "y");  // runner-up, margin 2: other
  add("x", {{"x", -0.70}, {"y", -0.72}}, "z");  // not the runner-up: other
  add("x", {}, "y");                            // no top data: unknown, other
  add("x", {{"x", -0.70}}, "y");                // one alternative only: unknown, other
  const ReferenceReport r = compare_dumps(ref, got);
  ASSERT_EQ(r.per_prompt.size(), 5u);
  EXPECT_EQ(r.tie_margin, kDefaultTieMargin);
  const auto& c = r.per_prompt;
  EXPECT_TRUE(c[0].near_tie);
  EXPECT_TRUE(c[0].got_was_runner_up);
  EXPECT_NEAR(c[0].ref_margin, 0.02, 1e-12);
  EXPECT_FALSE(c[1].near_tie);
  EXPECT_TRUE(c[1].got_was_runner_up);
  EXPECT_NEAR(c[1].ref_margin, 2.0, 1e-12);
  EXPECT_FALSE(c[2].near_tie);
  EXPECT_FALSE(c[2].got_was_runner_up);
  EXPECT_NEAR(c[2].ref_margin, 0.02, 1e-12);
  for (size_t i : {3, 4}) {
    EXPECT_FALSE(c[i].near_tie) << i;
    EXPECT_TRUE(std::isnan(c[i].ref_margin)) << i;
  }
  EXPECT_EQ(r.near_tie_divergences, 1u);
  EXPECT_EQ(r.other_divergences, 4u);
  EXPECT_EQ(r.unknown_margin, 2u);
  EXPECT_EQ(near_tie_summary(r),
            "divergences: 1 at near ties (margin <= 0.05, the other run's token was the runner-up), 4 other "
            "(2 without the reference's top-2 data)");
  const auto j = report_to_json(r);
  EXPECT_EQ(j["near_tie_divergences"], 1);
  EXPECT_EQ(j["other_divergences"], 4);
  EXPECT_EQ(j["unknown_margin_divergences"], 2);
  EXPECT_EQ(j["per_prompt"][0]["near_tie"], true);
  EXPECT_NEAR(j["per_prompt"][0]["ref_margin"].get<double>(), 0.02, 1e-12);
  EXPECT_TRUE(j["per_prompt"][3]["ref_margin"].is_null());
  // A wider margin makes the second a near tie too; a zero margin only exact ties.
  const ReferenceReport wide = compare_dumps(ref, got, 2.5);
  EXPECT_EQ(wide.near_tie_divergences, 2u);
  EXPECT_EQ(wide.other_divergences, 3u);
  EXPECT_EQ(compare_dumps(ref, got, 0.0).near_tie_divergences, 0u);
  EXPECT_THROW(compare_dumps(ref, got, -1.0), kiln::Error);
  // Identical outputs: no divergences of either kind.
  const ReferenceReport same = compare_dumps(ref, ref);
  EXPECT_EQ(same.near_tie_divergences + same.other_divergences, 0u);
  EXPECT_EQ(near_tie_summary(same),
            "divergences: 0 at near ties (margin <= 0.05, the other run's token was the runner-up), 0 other");
}

TEST(ClientEvalReference, AnEndedOutputIsNotANearTie) {
  // The candidate stops where the reference went on: no candidate token, so no runner-up match.
  const RefDump ref = dump_with_top({"a", "b"}, {-0.1, -0.7}, {{{"a", -0.1}}, {{"b", -0.7}, {"c", -0.71}}});
  const RefDump got = dump_with_top({"a"}, {-0.1}, {{{"a", -0.1}}});
  const ReferenceReport r = compare_dumps(ref, got);
  EXPECT_EQ(r.per_prompt[0].first_divergence, 1);
  EXPECT_NEAR(r.per_prompt[0].ref_margin, 0.01, 1e-12);
  EXPECT_FALSE(r.per_prompt[0].got_was_runner_up);
  EXPECT_FALSE(r.per_prompt[0].near_tie);
  // The reference stops where the candidate went on: no reference step, margin unknown.
  const ReferenceReport back = compare_dumps(got, ref);
  EXPECT_TRUE(std::isnan(back.per_prompt[0].ref_margin));
  EXPECT_EQ(back.unknown_margin, 1u);
}

TEST(ClientEvalReference, AsksForTopTwoAlternatives) {
  const auto c = greedy_request_body(Api::completions, "m", "hi", 8);
  EXPECT_EQ(c["logprobs"], 2);
  EXPECT_EQ(c["temperature"], 0);
  EXPECT_EQ(c["max_tokens"], 8);
  const auto g = greedy_request_body(Api::generate, "", "hi", 8);
  EXPECT_EQ(g["return_logprob"], true);
  EXPECT_EQ(g["top_logprobs_num"], 2);
  EXPECT_EQ(g["sampling_params"]["max_new_tokens"], 8);
}

TEST(ClientEvalReference, ParsesCompletionsTopLogprobs) {
  // kiln serve's /v1/completions shape (and OpenAI's / vLLM's): per step a {token: logprob} map, whose
  // key order says nothing (nlohmann and many servers sort keys).
  const auto resp = nlohmann::json::parse(R"({"id": "cmpl-1", "object": "text_completion", "choices": [
    {"index": 0, "text": " Paris.", "finish_reason": "length", "logprobs": {
      "tokens": [" Paris", "."], "token_logprobs": [-0.25, -1.0],
      "top_logprobs": [{" London": -2.5, " Paris": -0.25}, {".": -1.0, ",": -1.01}],
      "text_offset": [0, 6]}}]})");
  const RefRecord r = record_from_response(Api::completions, "The capital", resp);
  EXPECT_EQ(r.text, " Paris.");
  EXPECT_EQ(r.tokens, (std::vector<std::string>{" Paris", "."}));
  EXPECT_EQ(r.logprobs, (std::vector<double>{-0.25, -1.0}));
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0], (Top{{" Paris", -0.25}, {" London", -2.5}}));  // best first
  EXPECT_EQ(r.top[1], (Top{{".", -1.0}, {",", -1.01}}));
  // The chat shape (a list of {token, logprob}) and null steps are taken too.
  auto chat = resp;
  chat["choices"][0]["logprobs"]["top_logprobs"] = nlohmann::json::parse(
      R"([[{"token": " Paris", "logprob": -0.25, "bytes": [32]}, {"token": " Rome", "logprob": -3.0}], null])");
  const RefRecord rc = record_from_response(Api::completions, "p", chat);
  EXPECT_EQ(rc.top[0], (Top{{" Paris", -0.25}, {" Rome", -3.0}}));
  EXPECT_TRUE(rc.top[1].empty());
  // No top_logprobs (a server that ignores the count) or null: no top data, not an error.
  auto none = resp;
  none["choices"][0]["logprobs"].erase("top_logprobs");
  EXPECT_TRUE(record_from_response(Api::completions, "p", none).top.empty());
  none["choices"][0]["logprobs"]["top_logprobs"] = nullptr;
  EXPECT_TRUE(record_from_response(Api::completions, "p", none).top.empty());
  // Malformed: wrong step count, a non-number logprob, a step that is neither a map nor a list.
  auto bad = resp;
  bad["choices"][0]["logprobs"]["top_logprobs"] = nlohmann::json::parse(R"([{" Paris": -0.25}])");
  EXPECT_THROW(record_from_response(Api::completions, "p", bad), kiln::Error);
  bad["choices"][0]["logprobs"]["top_logprobs"] = nlohmann::json::parse(R"([{" Paris": "x"}, {}])");
  EXPECT_THROW(record_from_response(Api::completions, "p", bad), kiln::Error);
  bad["choices"][0]["logprobs"]["top_logprobs"] = nlohmann::json::parse(R"([3, {}])");
  EXPECT_THROW(record_from_response(Api::completions, "p", bad), kiln::Error);
  bad["choices"][0]["logprobs"] = nullptr;
  EXPECT_THROW(record_from_response(Api::completions, "p", bad), kiln::Error);
}

TEST(ClientEvalReference, ParsesGenerateOutputTopLogprobs) {
  // kiln serve's /generate shape (SGLang's): per step a list of [logprob, id, text-or-null].
  const auto resp = nlohmann::json::parse(R"({"text": " Paris.", "output_ids": [12095, 13],
    "meta_info": {"id": "x", "finish_reason": {"type": "length", "length": 2}, "prompt_tokens": 4,
      "completion_tokens": 2, "output_token_logprobs": [[-0.25, 12095, null], [-1.0, 13, null]],
      "output_top_logprobs": [[[-0.25, 12095, null], [-2.5, 7042, null]], [[-1.0, 13, "."], [-1.01, 11, ","]]]}})");
  const RefRecord r = record_from_response(Api::generate, "The capital", resp);
  EXPECT_EQ(r.tokens, (std::vector<std::string>{"12095", "13"}));
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0], (Top{{"12095", -0.25}, {"7042", -2.5}}));
  EXPECT_EQ(r.top[1], (Top{{"13", -1.0}, {"11", -1.01}}));
  // A batch answer (a list of one) and a missing output_top_logprobs are taken.
  EXPECT_EQ(record_from_response(Api::generate, "p", nlohmann::json::array({resp})).top.size(), 2u);
  auto none = resp;
  none["meta_info"].erase("output_top_logprobs");
  EXPECT_TRUE(record_from_response(Api::generate, "p", none).top.empty());
  auto bad = resp;
  bad["meta_info"]["output_top_logprobs"][1] =
      nlohmann::json::parse(R"([["13", -1.0]])");  // id/logprob swapped
  EXPECT_THROW(record_from_response(Api::generate, "p", bad), kiln::Error);
  bad["meta_info"]["output_top_logprobs"] = nlohmann::json::parse(R"([[[-0.25, 12095, null]]])");  // one step
  EXPECT_THROW(record_from_response(Api::generate, "p", bad), kiln::Error);
  // Through a dump and a comparison: the candidate took id 11, the reference's runner-up 0.01 behind.
  RefDump ref;
  ref.api = "generate";
  ref.records = {r};
  RefDump got = ref;
  got.records[0].tokens[1] = "11";
  const ReferenceReport rep = compare_dumps(dump_from_json(dump_to_json(ref)), got);
  EXPECT_TRUE(rep.per_prompt[0].near_tie);
  EXPECT_NEAR(rep.per_prompt[0].ref_margin, 0.01, 1e-12);
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
