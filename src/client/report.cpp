#include "client/report.h"

#include <cstdio>
#include <fstream>

#include "kiln/error.h"

namespace kiln::client {

using json = nlohmann::json;

json summary_to_json(const Summary& s) {
  return {{"n", s.n},     {"mean", s.mean}, {"median", s.median}, {"p95", s.p95},
          {"p99", s.p99}, {"min", s.min},   {"max", s.max}};
}

json level_to_json(const LevelMetrics& m) {
  return {{"concurrency", m.concurrency},
          {"num_prompts", m.num_prompts},
          {"valid", m.valid},
          {"exact", m.exact},
          {"failed", m.failed},
          {"mismatched", m.mismatched},
          {"notes", m.notes},
          {"duration_s", m.duration_s},
          {"input_tokens", m.input_tokens},
          {"output_tokens", m.output_tokens},
          {"output_throughput_tok_s", m.output_tok_s},
          {"input_throughput_tok_s", m.input_tok_s},
          {"request_throughput_req_s", m.req_s},
          {"ttft_ms", summary_to_json(m.ttft_ms)},
          {"tpot_ms", summary_to_json(m.tpot_ms)},
          {"itl_ms", summary_to_json(m.itl_ms)},
          {"e2e_ms", summary_to_json(m.e2e_ms)}};
}

static json workload_json(const SweepOptions& opt, const std::string& model) {
  const Workload& w = opt.workload;
  json j = {{"base_url", opt.run.base_url},
            {"api", api_name(opt.run.stream.api)},
            {"model", model},
            {"output_len", w.output_len},
            {"seed", w.seed},
            {"flush_cache", opt.flush_cache},
            {"json_schema",
             opt.run.stream.json_schema.empty() ? json(nullptr) : json::parse(opt.run.stream.json_schema)}};
  if (w.texts.empty()) {
    j["prompts"] = "random token ids";
    j["input_len"] = w.input_len;
    j["token_id_range"] = {w.vocab_lo, w.vocab_hi};
  } else {
    j["prompts"] = "text file (" + std::to_string(w.texts.size()) + " prompts)";
  }
  return j;
}

json sweep_to_json(const SweepOptions& opt, const SweepResult& r, const std::string& model) {
  json levels = json::array();
  for (const auto& m : r.levels) levels.push_back(level_to_json(m));
  return {{"tool", "kiln bench serve"},
          {"date_utc", r.date_utc},
          {"workload", workload_json(opt, model)},
          {"levels", levels}};
}

static std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

static std::string cell(const Summary& s) {
  if (s.n == 0) return "–";
  return fmt("%.1f", s.mean) + " / " + fmt("%.1f", s.median) + " / " + fmt("%.1f", s.p95) + " / " +
         fmt("%.1f", s.p99);
}

std::string sweep_to_markdown(const SweepOptions& opt, const SweepResult& r, const std::string& model) {
  const Workload& w = opt.workload;
  std::string md = "Serving sweep, " + r.date_utc + ": `" + opt.run.base_url + "` (" +
                   api_name(opt.run.stream.api) + (model.empty() ? "" : ", model `" + model + "`") + "), ";
  md += w.texts.empty() ? std::to_string(w.input_len) + " random input tokens" : "text prompts";
  md += " / " + std::to_string(w.output_len) + " output tokens (ignore_eos), seed " + std::to_string(w.seed) +
        (opt.run.stream.json_schema.empty() ? "" : ", every request constrained by a JSON Schema") + ".\n";
  md += "Latencies in ms as mean / median / p95 / p99.\n\n";
  md += "| C | prompts | valid | out tok/s | req/s | TTFT ms | TPOT ms | ITL ms | E2E ms |\n";
  md += "|---:|---:|:---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& m : r.levels) {
    md += "| " + std::to_string(m.concurrency) + " | " + std::to_string(m.num_prompts) + " | " +
          (m.valid ? "yes" : "**no**") + " | " + fmt("%.1f", m.output_tok_s) + " | " + fmt("%.3f", m.req_s) +
          " | " + cell(m.ttft_ms) + " | " + cell(m.tpot_ms) + " | " + cell(m.itl_ms) + " | " +
          cell(m.e2e_ms) + " |\n";
  }
  bool any_note = false;
  for (const auto& m : r.levels)
    for (const auto& n : m.notes) {
      if (!any_note) md += "\nNotes:\n";
      any_note = true;
      md += "- C=" + std::to_string(m.concurrency) + ": " + n + "\n";
    }
  return md;
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  KILN_CHECK(out.good(), "cannot write '", path, "'");
  out << text;
  out.close();
  KILN_CHECK(out.good(), "failed writing '", path, "'");
}

}  // namespace kiln::client
