// `kiln bench serve`: concurrency sweep against any OpenAI-compatible / SGLang-style server.
#include <cstdio>

#include "cli/client_flags.h"
#include "cli/command.h"
#include "client/report.h"

namespace {

constexpr const char* kHelp =
    "usage: kiln bench serve --base-url http://HOST:PORT [flags]\n"
    "  --concurrency LIST           levels, e.g. 1,4,8,16,32,64,128 (the default)\n"
    "  --num-prompts N|LIST         measured requests per level (default 30,40,80,80,160,320,640; else "
    "max(30,5C))\n"
    "  --out PREFIX                 write PREFIX.json, PREFIX.md and PREFIX.svg\n"
    "  --title TEXT                 plot title\n";

int run_bench_serve(const kiln::cli::Args& args) {
  using namespace kiln;
  std::set<std::string> values = cli::kWorkloadFlags;
  values.insert({"base-url", "concurrency", "num-prompts", "out", "title"});
  std::set<std::string> bools = cli::kWorkloadBoolFlags;
  bools.insert("help");
  const cli::Flags f(args, values, bools);
  if (f.flag("help")) {
    std::fprintf(stdout, "%s%s", kHelp, cli::kWorkloadHelp);
    return 0;
  }
  client::SweepOptions opt = cli::workload_from_flags(f);
  opt.run.base_url = f.required("base-url");
  client::parse_base_url(opt.run.base_url);
  if (f.has("concurrency")) {
    opt.concurrency.clear();
    for (int64_t c : cli::parse_int_list(f.str("concurrency"), "concurrency")) {
      KILN_CHECK(c <= 4096, "--concurrency ", c, " is too large (at most 4096)");
      opt.concurrency.push_back(int(c));
    }
  }
  if (f.has("num-prompts")) {
    const auto n = cli::parse_int_list(f.str("num-prompts"), "num-prompts");
    KILN_CHECK(n.size() == 1 || n.size() == opt.concurrency.size(), "--num-prompts needs one count or ",
               opt.concurrency.size(), " (one per level), got ", n.size());
    for (size_t l = 0; l < opt.concurrency.size(); ++l)
      opt.num_prompts.push_back(size_t(n.size() == 1 ? n[0] : n[l]));
  }
  if (opt.run.stream.api == client::Api::completions && opt.run.stream.model.empty())
    opt.run.stream.model = client::discover_model(opt.run);
  const std::string model = opt.run.stream.model;

  // With --out the files are rewritten after every level, so a sweep cut short keeps what it measured.
  const std::string prefix = f.str("out");
  auto write_outputs = [&](const client::SweepResult& r) {
    std::string title = f.str("title");
    if (title.empty())
      title = "kiln bench serve: " + opt.run.base_url + ", " +
              (opt.workload.texts.empty() ? std::to_string(opt.workload.input_len) : std::string("text")) +
              " in / " + std::to_string(opt.workload.output_len) + " out, " + r.date_utc;
    client::write_text_file(prefix + ".json", client::sweep_to_json(opt, r, model).dump(2) + "\n");
    client::write_text_file(prefix + ".md", client::sweep_to_markdown(opt, r, model));
    client::write_text_file(prefix + ".svg", client::sweep_to_svg(r, title));
  };
  // One line per finished level on stderr, so that a log cut short still shows the measured levels.
  auto on_level = [&](const client::SweepResult& r) {
    const client::LevelMetrics& l = r.levels.back();
    std::fprintf(stderr, "C=%d: %s, %.1f out tok/s, %.3f req/s, TTFT median %.1f ms, TPOT median %.2f ms\n",
                 l.concurrency, l.valid ? "valid" : "INVALID", l.output_tok_s, l.req_s, l.ttft_ms.median,
                 l.tpot_ms.median);
    if (!prefix.empty()) write_outputs(r);
  };
  const client::SweepResult r = client::run_sweep(opt, on_level);
  std::fputs(client::sweep_to_markdown(opt, r, model).c_str(), stdout);
  if (!prefix.empty())
    std::fprintf(stderr, "wrote %s.json, %s.md, %s.svg\n", prefix.c_str(), prefix.c_str(), prefix.c_str());
  for (const auto& l : r.levels)
    if (!l.valid) {
      std::fprintf(stderr, "kiln bench serve: level C=%d is INVALID (see the notes)\n", l.concurrency);
      return 3;
    }
  return 0;
}

}  // namespace

KILN_COMMAND("bench serve", "serving sweep against any OpenAI-compatible server (JSON, Markdown, SVG)",
             run_bench_serve);
