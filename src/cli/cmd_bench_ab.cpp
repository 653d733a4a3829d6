// `kiln bench ab`: A1 -> B -> A2 windows on identical workloads, change of B with paired bootstrap intervals.
#include <cstdio>

#include "cli/client_flags.h"
#include "cli/command.h"
#include "client/ab.h"
#include "client/report.h"

namespace {

constexpr const char* kHelp =
    "usage: kiln bench ab --a http://HOST:PORT --b http://HOST:PORT [flags]\n"
    "  --concurrency C              requests in flight per window (default 16)\n"
    "  --num-prompts N              measured requests per window (default 80)\n"
    "  --rounds K                   crossover: windows A1 B1 A2 ... BK A(K+1) (default 1: A1 -> B -> A2)\n"
    "  --resamples N                bootstrap resamples (default 2000); --bootstrap-seed N (default 12345)\n"
    "  --model-a NAME --model-b NAME  per-server model names for /v1/completions (default: --model or "
    "discovered)\n"
    "  --out PREFIX                 write PREFIX.json and PREFIX.md\n";

int run_bench_ab(const kiln::cli::Args& args) {
  using namespace kiln;
  std::set<std::string> values = cli::kWorkloadFlags;
  values.insert({"a", "b", "concurrency", "num-prompts", "resamples", "bootstrap-seed", "rounds", "model-a",
                 "model-b", "out"});
  std::set<std::string> bools = cli::kWorkloadBoolFlags;
  bools.insert("help");
  const cli::Flags f(args, values, bools);
  if (f.flag("help")) {
    std::fprintf(stdout, "%s%s", kHelp, cli::kWorkloadHelp);
    return 0;
  }
  client::AbOptions opt;
  opt.sweep = cli::workload_from_flags(f);
  opt.url_a = f.required("a");
  opt.url_b = f.required("b");
  client::parse_base_url(opt.url_a);
  client::parse_base_url(opt.url_b);
  opt.concurrency = int(f.i64("concurrency", 16));
  KILN_CHECK(opt.concurrency > 0 && opt.concurrency <= 4096, "--concurrency must be in [1, 4096]");
  const int64_t n = f.i64("num-prompts", 80);
  KILN_CHECK(n >= 2, "--num-prompts must be at least 2 for a paired comparison");
  opt.num_prompts = size_t(n);
  opt.rounds = int(f.i64("rounds", 1));
  KILN_CHECK(opt.rounds >= 1 && opt.rounds <= 100, "--rounds must be in [1, 100]");
  opt.resamples = int(f.i64("resamples", 2000));
  KILN_CHECK(opt.resamples >= 100 && opt.resamples <= 1000000, "--resamples must be in [100, 1000000]");
  opt.bootstrap_seed = uint64_t(f.i64("bootstrap-seed", 12345));
  opt.model_a = f.str("model-a", opt.sweep.run.stream.model);
  opt.model_b = f.str("model-b", opt.sweep.run.stream.model);
  if (opt.sweep.run.stream.api == client::Api::completions) {
    client::RunOptions probe = opt.sweep.run;
    if (opt.model_a.empty()) {
      probe.base_url = opt.url_a;
      opt.model_a = client::discover_model(probe);
    }
    if (opt.model_b.empty()) {
      probe.base_url = opt.url_b;
      opt.model_b = client::discover_model(probe);
    }
  }
  const client::AbResult r = client::run_ab(opt);
  const std::string md = client::ab_to_markdown(opt, r);
  std::fputs(md.c_str(), stdout);
  if (f.has("out")) {
    const std::string prefix = f.str("out");
    client::write_text_file(prefix + ".json", client::ab_to_json(opt, r).dump(2) + "\n");
    client::write_text_file(prefix + ".md", md);
    std::fprintf(stderr, "wrote %s.json, %s.md\n", prefix.c_str(), prefix.c_str());
  }
  if (!r.valid) {
    std::fprintf(stderr, "kiln bench ab: INVALID (a window failed exact accounting)\n");
    return 3;
  }
  return 0;
}

}  // namespace

KILN_COMMAND("bench ab", "A1 -> B -> A2 comparison of two servers with paired bootstrap intervals",
             run_bench_ab);
