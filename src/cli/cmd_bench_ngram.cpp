// kiln bench ngram: CPU time of n-gram drafting's index (src/spec/ngram_index.h) as the engine uses it: each
// of R requests' first draft indexes its whole prompt (one append(span) into a fresh index), then decode
// appends one token and proposes k drafts per step.
//   kiln bench ngram [--requests R] [--prompt-len L] [--decode D] [--min N] [--max N] [--k K] [--reps N]
// Defaults: 256 requests of 1024-token prompts, 256 decode steps, window [1, 12] (SGLang's), k = 4, 5 reps.
// Prompts: random over a 151k vocabulary (few repeats) and over 50 tokens (many). Prints the median and
// minimum ns per prompt token for the prompt appends and ns per decode step (append + propose), and the
// share of decode steps that drafted. The R indexes are all live at once, so first-touch page faults of their
// tables count.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <span>
#include <vector>

#include "cli/command.h"
#include "cli/flags.h"
#include "kiln/error.h"
#include "spec/ngram_index.h"

namespace {

using Clock = std::chrono::steady_clock;

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

int run_bench_ngram(const kiln::cli::Args& args) {
  const kiln::cli::Flags f(args, {"requests", "prompt-len", "decode", "min", "max", "k", "reps"});
  for (const auto& a : f.positional()) KILN_FAIL("unexpected argument '", a, "'");
  const int64_t R = f.i64("requests", 256), L = f.i64("prompt-len", 1024), D = f.i64("decode", 256);
  const int64_t reps = f.i64("reps", 5), k = f.i64("k", 4);
  const int32_t lo = int32_t(f.i64("min", 1)), hi = int32_t(f.i64("max", 12));
  KILN_CHECK(R >= 1 && L >= 1 && D >= 1 && reps >= 1 && reps <= 1000 && k >= 1 && k <= 64,
             "--requests, --prompt-len, --decode, --k (<= 64) and --reps (<= 1000) must be positive");
  (void)kiln::spec::NgramIndex(lo, hi);  // checks the window
  std::printf(
      "n-gram index on the CPU (one thread): %lld requests x %lld-token prompts, %lld decode steps, "
      "window [%d, %d], k = %lld, %lld reps\n\n",
      (long long)R, (long long)L, (long long)D, lo, hi, (long long)k, (long long)reps);
  std::printf(
      "| prompt vocabulary | append ns/token (median) | min | decode step ns (median) | min | drafted |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const int32_t vocab : {151936, 50}) {
    std::mt19937_64 rng{uint64_t(vocab)};
    std::vector<std::vector<int32_t>> prompts(size_t(R), std::vector<int32_t>(size_t(L + D)));
    for (auto& p : prompts)
      for (int32_t& t : p) t = int32_t(rng() % uint64_t(vocab));
    std::vector<double> append_ns, step_ns;
    int64_t drafted = 0;  // decode steps that drafted
    for (int64_t rep = 0; rep < reps; ++rep) {
      std::vector<kiln::spec::NgramIndex> idx(size_t(R), kiln::spec::NgramIndex(lo, hi));
      Clock::time_point t0 = Clock::now();
      for (size_t r = 0; r < idx.size(); ++r) idx[r].append(std::span(prompts[r]).first(size_t(L)));
      append_ns.push_back(ns_since(t0) / double(R * L));
      t0 = Clock::now();
      for (int64_t d = 0; d < D; ++d)
        for (size_t r = 0; r < idx.size(); ++r) {
          idx[r].append(prompts[r][size_t(L + d)]);
          drafted += !idx[r].propose(int32_t(k)).empty();
        }
      step_ns.push_back(ns_since(t0) / double(R * D));
    }
    std::sort(append_ns.begin(), append_ns.end());
    std::sort(step_ns.begin(), step_ns.end());
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.0f%% |\n", vocab, append_ns[append_ns.size() / 2],
                append_ns.front(), step_ns[step_ns.size() / 2], step_ns.front(),
                100.0 * double(drafted) / double(reps * R * D));
  }
  return 0;
}

}  // namespace

KILN_COMMAND("bench ngram", "CPU time of the n-gram drafting index (prompt appends, decode append + propose)",
             run_bench_ngram);
