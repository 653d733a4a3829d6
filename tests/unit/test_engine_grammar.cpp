// Structured output in the engine over the FakeRunner (a byte vocabulary: id = byte, 256 = EOS; logits
// near-uniform in [0, 1) with one peak): with temperature 1 and many seeds the unconstrained outputs are
// byte garbage, so every output that parses and validates does so because of the grammar. JSON Schema,
// regex and choice, on the host sampler and the fake device sampler; a grammar that ends finishes the
// request with "stop" (also under ignore_eos); the grammar starts after `grammar_after_token`; constrained
// rows verify n-gram drafts under per-position masks; the engine counts its masks; each step's masks are
// computed while its forward runs, on every sampling path, the overlap schedule's included.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "engine_test_util.h"
#include "kiln/grammar.h"
#include "runtime/engine.h"
#include "runtime/fake_runner.h"
#include "runtime/grammar_masks.h"

namespace kiln {
namespace {

using nlohmann::json;
using test::prompt_of;
using test::Sink;
using test::small_opts;

constexpr int64_t kVocab = 300;
constexpr int32_t kEos = 256;

std::shared_ptr<const grammar::TokenVocab> byte_vocab() {
  std::vector<std::string> bytes(static_cast<size_t>(kVocab));
  for (int i = 0; i < 256; ++i) bytes[size_t(i)] = std::string(1, char(i));
  return grammar::make_vocab(std::move(bytes), {kEos});
}

const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 6},
  "n": {"type": "integer", "minimum": -5, "maximum": 500},
  "ok": {"type": "boolean"},
  "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
  "required": ["name", "n", "ok", "tags"], "additionalProperties": false})";

// The schema above, checked by hand on a parsed document.
bool valid_doc(const json& j) {
  if (!j.is_object() || j.size() != 4) return false;
  if (!j.contains("name") || !j["name"].is_string()) return false;
  if (!j.contains("n") || !j["n"].is_number_integer() || j["n"].get<int64_t>() < -5 ||
      j["n"].get<int64_t>() > 500)
    return false;
  if (!j.contains("ok") || !j["ok"].is_boolean()) return false;
  if (!j.contains("tags") || !j["tags"].is_array() || j["tags"].size() > 3) return false;
  for (const json& t : j["tags"])
    if (t != "a" && t != "b") return false;
  return true;
}

struct Output {
  std::string text;  // the output bytes, EOS left out
  std::string finish;
  bool ended_with_eos = false;
};

std::vector<Output> run_requests(std::shared_ptr<const grammar::CompiledGrammar> g, int seeds, int max_tokens,
                                 bool device_sampling, EngineStats* stats = nullptr,
                                 const std::function<void(Request&)>& edit = {},
                                 EngineOptions opts = small_opts(1 << 14), bool launch_ahead = false,
                                 int64_t* deferred_steps = nullptr) {
  auto model = std::make_unique<FakeRunner>(kVocab, 8, kEos);
  model->device_sampling = device_sampling;
  model->launch_ahead = launch_ahead;
  const FakeRunner& fake = *model;
  Engine engine(std::move(model), opts);
  Sink sink;
  std::vector<RequestId> ids;
  for (int s = 0; s < seeds; ++s) {
    Request r;
    r.prompt = prompt_of(5 + s % 7, s);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 1000 + s;
    r.sampling.max_new_tokens = max_tokens;
    r.grammar = g;
    if (edit) edit(r);
    ids.push_back(engine.submit(r, sink.cb()));
  }
  sink.wait_finished(seeds);
  sink.expect_one_finish_each();
  std::vector<Output> out;
  for (RequestId id : ids) {
    Output x;
    for (int32_t t : sink.tokens(id)) {
      if (t == kEos)
        x.ended_with_eos = true;
      else if (t < 256)
        x.text += char(t);
    }
    x.finish = sink.last(id).finish_reason;
    out.push_back(x);
  }
  if (stats) *stats = engine.stats();
  engine.shutdown(true);
  if (deferred_steps) *deferred_steps = fake.deferred_steps;
  return out;
}

TEST(EngineGrammar, JsonSchemaOutputsParseAndValidateForEverySeedOnBothSamplers) {
  const auto vocab = byte_vocab();
  const auto g = grammar::compile(grammar::GrammarKind::json_schema, kSchema, vocab);
  for (bool device : {false, true}) {
    EngineStats st;
    const std::vector<Output> runs = run_requests(g, 24, 400, device, &st);
    int64_t tokens = 0;
    for (const Output& r : runs) {
      EXPECT_EQ(r.finish, "stop") << r.text;
      EXPECT_TRUE(r.ended_with_eos) << r.text;
      json j;
      ASSERT_NO_THROW(j = json::parse(r.text)) << r.text;
      EXPECT_TRUE(valid_doc(j)) << r.text;
      tokens += int64_t(r.text.size()) + 1;
    }
    // One mask per constrained draw, counted by the engine.
    EXPECT_EQ(st.grammar_masks, tokens) << "device " << device;
    EXPECT_EQ(st.grammar_mask.count, uint64_t(tokens));
    EXPECT_GT(st.grammar_mask_max, 0.0);
  }
}

TEST(EngineGrammar, WithoutTheGrammarTheSameSeedsAreNotJson) {
  // The control: the model alone writes garbage, so the test above proves the grammar's work.
  const std::vector<Output> runs = run_requests(nullptr, 24, 60, false);
  int parsed = 0;
  for (const Output& r : runs) {
    try {
      parsed += valid_doc(json::parse(r.text)) ? 1 : 0;
    } catch (const json::exception&) {
    }
  }
  EXPECT_EQ(parsed, 0);
}

TEST(EngineGrammar, RegexAndChoiceOutputsMatch) {
  const auto vocab = byte_vocab();
  const auto re = grammar::compile(grammar::GrammarKind::regex, "[a-c]{2,4}-[0-9]{1,3}", vocab);
  for (const Output& r : run_requests(re, 20, 50, false)) {
    EXPECT_EQ(r.finish, "stop");
    EXPECT_TRUE(std::regex_match(r.text, std::regex("[a-c]{2,4}-[0-9]{1,3}"))) << r.text;
  }
  const auto choice =
      grammar::compile(grammar::GrammarKind::ebnf, R"(root ::= "yes" | "no" | "maybe \"so\"")", vocab);
  std::set<std::string> seen;
  for (const Output& r : run_requests(choice, 20, 50, true)) {
    EXPECT_EQ(r.finish, "stop");
    EXPECT_TRUE(r.text == "yes" || r.text == "no" || r.text == "maybe \"so\"") << r.text;
    seen.insert(r.text);
  }
  EXPECT_GE(seen.size(), 2u);  // sampled, not forced to one answer
}

TEST(EngineGrammar, AnEndedGrammarStopsTheRequestEvenUnderIgnoreEos) {
  const auto vocab = byte_vocab();
  const auto g = grammar::compile(grammar::GrammarKind::regex, "ok", vocab);
  for (const Output& r :
       run_requests(g, 4, 50, false, nullptr, [](Request& q) { q.sampling.ignore_eos = true; })) {
    EXPECT_EQ(r.text, "ok");
    EXPECT_EQ(r.finish, "stop");
    EXPECT_TRUE(r.ended_with_eos);
  }
  // max_tokens cutting a value: "length", the prefix still inside the grammar.
  const auto long_g = grammar::compile(grammar::GrammarKind::regex, "x{20}", vocab);
  for (const Output& r : run_requests(long_g, 2, 5, false)) {
    EXPECT_EQ(r.finish, "length");
    EXPECT_EQ(r.text, "xxxxx");
  }
}

TEST(EngineGrammar, GrammarStartsAfterItsTriggerToken) {
  GrammarState s(grammar::compile(grammar::GrammarKind::regex, "ab", byte_vocab()), '#');
  EXPECT_FALSE(s.active);
  EXPECT_EQ(s.advance('z'), "");  // free before the trigger
  EXPECT_FALSE(s.active);
  EXPECT_EQ(s.advance('#'), "");
  EXPECT_TRUE(s.active);
  EXPECT_NE(s.advance('z'), "");  // refused: names the token
  EXPECT_EQ(s.advance('a'), "");
  EXPECT_EQ(s.advance('b'), "");
  EXPECT_EQ(s.advance(kEos), "");
  EXPECT_TRUE(s.terminated());
  // In the engine: a request whose trigger never comes is not constrained.
  const auto g = grammar::compile(grammar::GrammarKind::regex, "q+", byte_vocab());
  for (const Output& r :
       run_requests(g, 4, 12, false, nullptr, [](Request& q) { q.grammar_after_token = 299; }))
    EXPECT_NE(r.text.find_first_not_of('q'), std::string::npos) << r.text;
}

TEST(EngineGrammar, SpeculativeDecodingLeavesGrammarRequestsValid) {
  EngineOptions o = small_opts(1 << 14);
  o.speculative.algorithm = spec::SpecAlgorithm::ngram;
  o.speculative.num_draft_tokens = 4;
  const auto g = grammar::compile(grammar::GrammarKind::json_schema, kSchema, byte_vocab());
  for (const Output& r : run_requests(g, 8, 400, false, nullptr, {}, o)) {
    EXPECT_EQ(r.finish, "stop");
    json j;
    ASSERT_NO_THROW(j = json::parse(r.text)) << r.text;
    EXPECT_TRUE(valid_doc(j)) << r.text;
  }
}

// Constrained rows verify n-gram drafts: each draft is cut before the first token the grammar refuses and
// each verified position drawn under its own mask (the grammar after the drafts before it), so greedy outputs
// equal those without speculation, token for token, and drafts were kept. Under a grammar of a's and b's the
// fake model's greedy choice is a pseudo-random binary string: n-gram lookups find matches in it.
TEST(EngineGrammar, ConstrainedRowsVerifyDraftsUnderTheirGrammarWithGreedyOutputsUnchanged) {
  const auto g = grammar::compile(grammar::GrammarKind::regex, "[ab]{80}", byte_vocab());
  EngineOptions plain = small_opts(1 << 14), speculative = plain;
  speculative.speculative.algorithm = spec::SpecAlgorithm::ngram;
  speculative.speculative.num_draft_tokens = 4;
  speculative.speculative.off_switch = false;  // verify whenever there are drafts, whatever the clock says
  const auto greedy_edit = [](Request& r) {
    r.sampling.temperature = 0.0f;
    r.sampling.return_logprob = true;
  };
  EngineStats st_plain, st_spec;
  const std::vector<Output> a = run_requests(g, 6, 120, false, &st_plain, greedy_edit, plain);
  const std::vector<Output> b = run_requests(g, 6, 120, false, &st_spec, greedy_edit, speculative);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].text, a[i].text) << "request " << i;
    EXPECT_EQ(b[i].finish, "stop");
    EXPECT_TRUE(b[i].ended_with_eos);
    EXPECT_TRUE(std::regex_match(b[i].text, std::regex("[ab]{80}"))) << b[i].text;
  }
  EXPECT_GT(st_spec.spec.verify_steps, 0);
  EXPECT_GT(st_spec.spec.accepted_tokens, 0);
  EXPECT_LT(st_spec.steps, st_plain.steps);  // kept drafts save steps
}

TEST(EngineGrammar, ABoundedGrammarCacheDropsItsOldestEntry) {
  grammar::GrammarCache cache(byte_vocab(), 2);
  const auto a = cache.get(grammar::GrammarKind::regex, "a");
  EXPECT_EQ(cache.get(grammar::GrammarKind::regex, "a"), a);  // by content
  (void)cache.get(grammar::GrammarKind::regex, "b");
  (void)cache.get(grammar::GrammarKind::regex, "c");
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_NE(cache.get(grammar::GrammarKind::regex, "a"), a);  // "a" went first: compiled again
}

// The k-th mask of a lone request belongs to its k-th forward pass (a prompt in one chunk): an injected slow
// mask worker waits until that forward has started. Masks that the engine waits for before it queues the
// forward never see it (the worker gives up after a bound, so that order fails instead of hanging); masks
// computed while the forward runs always do, whatever the threads' timing. Three paths: the host draw, the
// device draw one step at a time (forward_sampled), and the overlap schedule's steps launched ahead, whose
// forward is queued before the token of the step before is known (launch_forward, then sample_launched).
TEST(EngineGrammar, TheForwardIsQueuedBeforeTheStepsMasksFinishOnEverySamplingPath) {
  const auto g = grammar::compile(grammar::GrammarKind::regex, "abcdef", byte_vocab());
  enum Path { host, device, launched };
  for (Path path : {host, device, launched}) {
    struct Probe {
      std::mutex mu;
      std::condition_variable cv;
      int64_t forwards = 0, masks = 0, overlapped = 0, alone = 0;
    } probe;
    EngineOptions o = small_opts(1 << 14);
    o.grammar_mask_timeout_ms = 60'000;  // the engine never gives up first
    o.overlap_schedule = true;
    o.grammar_mask_hook = [&probe] {
      std::unique_lock<std::mutex> lk(probe.mu);
      const int64_t k = ++probe.masks;
      const bool seen = probe.cv.wait_for(lk, std::chrono::seconds(1), [&] { return probe.forwards >= k; });
      ++(seen ? probe.overlapped : probe.alone);
    };
    auto model = std::make_unique<FakeRunner>(kVocab, 8, kEos);
    model->device_sampling = path != host;
    model->launch_ahead = path == launched;
    model->on_forward = [&probe] {
      std::lock_guard<std::mutex> lk(probe.mu);
      ++probe.forwards;
      probe.cv.notify_all();
    };
    FakeRunner& fake = *model;
    Engine engine(std::move(model), o);
    Sink sink;
    Request r;
    r.prompt = prompt_of(6, 1);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 5;
    r.sampling.max_new_tokens = 20;
    r.sampling.return_logprob = true;
    r.grammar = g;
    const RequestId id = engine.submit(r, sink.cb());
    sink.wait_finished(1);
    const std::vector<int32_t> want = {'a', 'b', 'c', 'd', 'e', 'f', kEos};
    EXPECT_EQ(sink.last(id).finish_reason, "stop") << "path " << path;
    EXPECT_EQ(sink.tokens(id), want) << "path " << path;
    // Logprobs of the masked distribution: each forced token takes all the mass.
    int64_t logprobs = 0;
    for (const TokenEvent& ev : sink.events[id]) {
      for (float lp : ev.logprobs) EXPECT_NEAR(lp, 0.0f, 1e-6f) << "path " << path << " #" << logprobs;
      logprobs += int64_t(ev.logprobs.size());
    }
    EXPECT_EQ(logprobs, 7);
    const EngineStats st = engine.stats();
    engine.shutdown(true);
    EXPECT_EQ(st.grammar_masks, 7) << "path " << path;
    EXPECT_EQ(probe.masks, 7);
    EXPECT_EQ(probe.overlapped, 7) << "path " << path << ": masks done before their forward was queued";
    EXPECT_EQ(probe.alone, 0) << "path " << path;
    // The six decode steps: launched ahead when the runner can (none run alone then; a seventh was launched
    // before the EOS of the sixth was seen, its row dropped), else one at a time and counted.
    EXPECT_EQ(fake.deferred_steps, path == launched ? 7 : 0);
    EXPECT_EQ(fake.chained_steps, path == launched ? 6 : 0);
    EXPECT_EQ(st.grammar_steps_not_overlapped, path == device ? 6 : 0) << "path " << path;
  }
}

// The overlap schedule with constrained rows in its batches (every third request free, some with top
// logprobs): their steps are launched ahead, each sampled once its masks are known, and every request draws
// what it draws one step at a time.
TEST(EngineGrammar, TheOverlapScheduleLaunchesConstrainedStepsAheadWithTheSameDraws) {
  const auto g = grammar::compile(grammar::GrammarKind::json_schema, kSchema, byte_vocab());
  const auto edit = [&](Request& r) {
    if (r.sampling.seed % 3 == 0) r.grammar = nullptr;
    if (r.sampling.seed % 4 == 1) {
      r.sampling.return_logprob = true;
      r.sampling.top_logprobs = 2;
    }
  };
  EngineOptions on = small_opts(1 << 14), off = on;
  on.overlap_schedule = true;
  off.overlap_schedule = false;
  EngineStats st_on, st_off;
  int64_t deferred_on = 0, deferred_off = 0;
  const std::vector<Output> a = run_requests(g, 12, 400, true, &st_off, edit, off, true, &deferred_off);
  const std::vector<Output> b = run_requests(g, 12, 400, true, &st_on, edit, on, true, &deferred_on);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].text, a[i].text) << "request " << i;
    EXPECT_EQ(b[i].finish, a[i].finish) << "request " << i;
    if ((1000 + i) % 3 == 0) continue;  // free
    EXPECT_EQ(a[i].finish, "stop");
    EXPECT_TRUE(valid_doc(json::parse(a[i].text))) << a[i].text;
  }
  EXPECT_EQ(deferred_off, 0);
  EXPECT_GT(deferred_on, 20);
  EXPECT_EQ(st_on.grammar_masks, st_off.grammar_masks);
  EXPECT_EQ(st_on.grammar_steps_not_overlapped, 0);
  EXPECT_EQ(st_on.finished_error, 0);
}

// A mask that misses grammar_mask_timeout_ms in a step launched ahead ends only its request, with the limit
// named. The third mask (sample_deferred's first) blocks until the test has seen the request end, so the
// limit must have fired; the next request is served constrained.
TEST(EngineGrammar, ALateMaskInAStepLaunchedAheadEndsItsRequestNamingTheLimit) {
  struct Block {
    std::mutex mu;
    std::condition_variable cv;
    int64_t masks = 0;
    bool released = false;
  } block;
  EngineOptions o = small_opts(1 << 14);
  o.overlap_schedule = true;
  o.grammar_mask_timeout_ms = 20;
  o.grammar_mask_hook = [&block] {
    std::unique_lock<std::mutex> lk(block.mu);
    if (++block.masks == 3) block.cv.wait(lk, [&] { return block.released; });
  };
  auto model = std::make_unique<FakeRunner>(kVocab, 8, kEos);
  model->device_sampling = true;
  model->launch_ahead = true;
  const FakeRunner& fake = *model;
  Engine engine(std::move(model), o);
  Sink sink;
  Request r;
  r.prompt = prompt_of(6, 2);
  r.sampling.max_new_tokens = 30;
  r.grammar = grammar::compile(grammar::GrammarKind::regex, "x{10}", byte_vocab());
  const RequestId late = engine.submit(r, sink.cb());
  sink.wait_finished(1);
  {
    std::lock_guard<std::mutex> lk(block.mu);
    block.released = true;
  }
  block.cv.notify_all();
  EXPECT_EQ(sink.last(late).finish_reason, "error");
  EXPECT_NE(sink.last(late).error.find("grammar_mask_timeout_ms"), std::string::npos)
      << sink.last(late).error;
  EXPECT_EQ(sink.tokens(late), (std::vector<int32_t>{'x', 'x'}));  // the late row's draw is not delivered
  const RequestId next = engine.submit(r, sink.cb());
  sink.wait_finished(2);
  EXPECT_EQ(sink.last(next).finish_reason, "stop");
  EXPECT_EQ(sink.tokens(next),
            (std::vector<int32_t>{'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', kEos}));
  sink.expect_one_finish_each();
  engine.shutdown(true);
  EXPECT_GT(fake.deferred_steps, 0);
}

// n = 4 choices of one constrained prompt (the followers wait for the first's prefill, each has its own
// matcher) through the overlap schedule's steps launched ahead: each choice valid, the seeded ones distinct.
TEST(EngineGrammar, ParallelChoicesEachFollowTheirOwnGrammarStateThroughStepsLaunchedAhead) {
  const auto g = grammar::compile(grammar::GrammarKind::json_schema, kSchema, byte_vocab());
  auto model = std::make_unique<FakeRunner>(kVocab, 8, kEos);
  model->device_sampling = true;
  model->launch_ahead = true;
  const FakeRunner& fake = *model;
  EngineOptions o = small_opts(1 << 14);
  o.overlap_schedule = true;
  Engine engine(std::move(model), o);
  Sink sink;
  std::vector<RequestId> ids;
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.prompt = prompt_of(9, 3);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 40 + i;
    r.sampling.max_new_tokens = 400;
    r.sampling.return_logprob = true;
    r.after_prefill_of = i == 0 ? 0 : ids[0];
    r.grammar = g;
    ids.push_back(engine.submit(r, sink.cb()));
  }
  sink.wait_finished(4);
  sink.expect_one_finish_each();
  std::set<std::string> texts;
  for (RequestId id : ids) {
    std::string text;
    for (int32_t t : sink.tokens(id))
      if (t < 256) text += char(t);
    EXPECT_EQ(sink.last(id).finish_reason, "stop") << text;
    EXPECT_TRUE(valid_doc(json::parse(text))) << text;
    texts.insert(text);
  }
  EXPECT_EQ(texts.size(), 4u);
  const EngineStats st = engine.stats();
  engine.shutdown(true);
  EXPECT_GT(fake.deferred_steps, 0);
  EXPECT_EQ(st.grammar_steps_not_overlapped, 0);
}

TEST(EngineGrammar, AFailedStepEndsItsConstrainedRowsAndTheEngineGoesOn) {
  const auto g = grammar::compile(grammar::GrammarKind::json_schema, kSchema, byte_vocab());
  auto model = std::make_unique<FakeRunner>(kVocab, 8, kEos);
  FakeRunner& fake = *model;
  fake.fail_at_step = 4;  // mid-decode: the masks of that step were started
  Engine engine(std::move(model), small_opts(1 << 14));
  Sink sink;
  std::vector<RequestId> ids;
  for (int s = 0; s < 3; ++s) {
    Request r;
    r.prompt = prompt_of(6, s);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = s;
    r.sampling.max_new_tokens = 400;
    r.grammar = g;
    ids.push_back(engine.submit(r, sink.cb()));
  }
  sink.wait_finished(3);
  int errors = 0;
  for (RequestId id : ids) errors += sink.last(id).finish_reason == "error" ? 1 : 0;
  EXPECT_GE(errors, 1);
  // The next request is served, constrained, as if nothing had happened.
  Request r;
  r.prompt = prompt_of(7, 9);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 9;
  r.sampling.max_new_tokens = 400;
  r.grammar = g;
  const RequestId id = engine.submit(r, sink.cb());
  sink.wait_finished(4);
  EXPECT_EQ(sink.last(id).finish_reason, "stop");
  std::string text;
  for (int32_t t : sink.tokens(id))
    if (t < 256) text += char(t);
  EXPECT_TRUE(valid_doc(json::parse(text))) << text;
  sink.expect_one_finish_each();
  engine.shutdown(true);
}

}  // namespace
}  // namespace kiln
