// kiln bench grammar --model DIR --schemas DIR_OR_JSONL [--walks N] [--max-tokens N] [--seed N]
//                    [--precompute] [--lenient]
// Compile time per schema and mask time per token (p50 / p99 / max, one thread) over seeded random walks of
// valid outputs: each step fills the mask (timed), then samples a token from it (half the time among the
// allowed tokens that carry JSON structure, so walks end), until the grammar is complete or --max-tokens.
// Times are process CPU time. The first walk of each grammar is "cold" (it fills the lazy mask cache); later
// walks are "warm". Schemas: every *.json file of a directory, or one schema per line of a JSONL file.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/flags.h"
#include "cli/grammar_vocab.h"
#include "grammar/compiled.h"
#include "kiln/error.h"
#include "kiln/grammar.h"
#include "kiln/tokenizer.h"

namespace {

// CPU time of the process (the bench is one thread), not wall time: the machines this runs on are shared,
// and a wall clock counts other processes' time slices. One clock read's cost is measured and subtracted.
struct Clock {
  static double now() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) * 1e6 + double(t.tv_nsec) * 1e-3;
  }
};
double g_clock_cost_us = 0;
double us_since(double t0) {
  return std::max(0.0, Clock::now() - t0 - g_clock_cost_us);
}
void calibrate_clock() {
  std::vector<double> d;
  for (int i = 0; i < 2001; ++i) {
    const double a = Clock::now();
    d.push_back(Clock::now() - a);
  }
  std::sort(d.begin(), d.end());
  g_clock_cost_us = d[d.size() / 2];
}

std::vector<std::pair<std::string, std::string>> load_schemas(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> out;  // (name, text)
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path))
      if (e.path().extension() == ".json") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& p : files) {
      std::ifstream f(p);
      std::stringstream ss;
      ss << f.rdbuf();
      out.push_back({p.filename().string(), ss.str()});
    }
  } else {
    std::ifstream f(path);
    KILN_CHECK(f.good(), "bench grammar: cannot read ", path);
    std::string line;
    size_t n = 0;
    while (std::getline(f, line))
      if (!line.empty()) out.push_back({path + ":" + std::to_string(++n), line});
  }
  KILN_CHECK(!out.empty(), "bench grammar: no schemas in ", path);
  return out;
}

struct Stats {
  std::vector<double> v;
  double pct(double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(p / 100.0 * double(v.size())))];
  }
  double mean() const {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / double(v.size());
  }
  nlohmann::json summary() {
    return {{"n", v.size()}, {"p50", pct(50)}, {"p99", pct(99)}, {"max", pct(100)}, {"mean", mean()}};
  }
};

inline int popcount32(uint32_t v) {  // SWAR: without -mpopcnt the builtin is a libgcc call
  v = v - ((v >> 1) & 0x55555555u);
  v = (v & 0x33333333u) + ((v >> 2) & 0x33333333u);
  return int((((v + (v >> 4)) & 0x0F0F0F0Fu) * 0x01010101u) >> 24);
}

// Picks the k-th set bit of mask & filter (filter may be null) uniformly; -1 when none.
int32_t sample(const std::vector<uint32_t>& mask, const std::vector<uint32_t>* filter, std::mt19937_64& rng) {
  size_t total = 0;
  for (size_t w = 0; w < mask.size(); ++w)
    total += size_t(popcount32(mask[w] & (filter ? (*filter)[w] : ~0u)));
  if (total == 0) return -1;
  size_t k = rng() % total;
  for (size_t w = 0; w < mask.size(); ++w) {
    uint32_t bits = mask[w] & (filter ? (*filter)[w] : ~0u);
    const size_t c = size_t(popcount32(bits));
    if (k >= c) {
      k -= c;
      continue;
    }
    for (; k > 0; --k) bits &= bits - 1;
    return int32_t(w * 32 + size_t(__builtin_ctz(bits)));
  }
  return -1;
}

int run_bench_grammar(const kiln::cli::Args& args) {
  using namespace kiln::grammar;
  const kiln::cli::Flags f(args, {"model", "schemas", "walks", "max-tokens", "seed"},
                           {"precompute", "lenient"});
  const auto tk = kiln::Tokenizer::load(f.required("model"));
  const auto schemas = load_schemas(f.required("schemas"));
  const int64_t walks = f.i64("walks", 2), max_tokens = f.i64("max-tokens", 400);
  KILN_CHECK(walks >= 1 && max_tokens >= 1, "--walks and --max-tokens must be >= 1");
  std::mt19937_64 rng(uint64_t(f.i64("seed", 1)));
  CompileOptions o;
  o.precompute = f.flag("precompute");
  o.lenient = f.flag("lenient");

  calibrate_clock();
  auto t0 = Clock::now();
  const auto vocab = kiln::cli::grammar_vocab(tk);
  const double vocab_ms = us_since(t0) / 1000;
  // Tokens carrying JSON structure (quotes, brackets, separators, digits): sampled half the time so walks
  // end.
  std::vector<uint32_t> structural(mask_words(*vocab), 0);
  for (int32_t id = 0; id < int32_t(vocab_size(*vocab)); ++id) {
    const std::string& b = vocab->bytes(id);
    if (!b.empty() && b.size() <= 3 && b.find_first_of("\"{}[],:0123456789") != std::string::npos)
      structural[size_t(id) >> 5] |= 1u << (id & 31);
  }
  Stats compile_us, cold_us, warm_us;
  size_t unsupported = 0, failed = 0, completed = 0, capped = 0, tokens = 0;
  std::map<std::string, size_t> refused;
  std::vector<uint32_t> mask(mask_words(*vocab));
  for (const auto& [name, text] : schemas) {
    std::shared_ptr<const CompiledGrammar> g;
    try {
      t0 = Clock::now();
      g = compile(GrammarKind::json_schema, text, vocab, o);
      compile_us.v.push_back(us_since(t0));
    } catch (const UnsupportedKeyword& e) {
      ++unsupported, ++refused[e.keyword()];
      continue;
    } catch (const kiln::Error& e) {
      ++failed;
      std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
      continue;
    }
    for (int64_t w = 0; w < walks; ++w) {
      Matcher m(g);
      for (int64_t i = 0; i < max_tokens; ++i) {
        t0 = Clock::now();
        m.fill_next_token_bitmask(mask.data(), mask.size());
        (w == 0 ? cold_us : warm_us).v.push_back(us_since(t0));
        ++tokens;
        if (m.is_complete()) {
          ++completed;
          break;
        }
        int32_t id = (rng() & 1) ? sample(mask, &structural, rng) : -1;
        if (id < 0) id = sample(mask, nullptr, rng);
        KILN_CHECK(id >= 0, "bench grammar: ", name, ": an empty mask mid-output (an engine bug)");
        KILN_CHECK(m.accept_token(id), "bench grammar: ", name,
                   ": a masked-in token was refused (an engine bug)");
        if (i + 1 == max_tokens) ++capped;
      }
    }
  }
  nlohmann::json out = {{"schemas", schemas.size()},
                        {"compiled", compile_us.v.size()},
                        {"unsupported", unsupported},
                        {"refused_keywords", refused},
                        {"failed", failed},
                        {"walks_completed", completed},
                        {"walks_capped", capped},
                        {"mask_calls", tokens},
                        {"vocab_size", vocab_size(*vocab)},
                        {"vocab_build_ms", vocab_ms},
                        {"precompute", o.precompute},
                        {"clock_cost_us", g_clock_cost_us},
                        {"compile_us", compile_us.summary()},
                        {"mask_us_cold", cold_us.summary()},
                        {"mask_us_warm", warm_us.summary()}};
  Stats all;
  all.v = cold_us.v;
  all.v.insert(all.v.end(), warm_us.v.begin(), warm_us.v.end());
  out["mask_us_all"] = all.summary();
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

KILN_COMMAND("bench grammar",
             "grammar compile time and per-token mask time over seeded walks of JSON schemas",
             run_bench_grammar);
