// Outputs of `kiln bench serve`: JSON (everything), Markdown (one table) and an SVG plot (throughput, TTFT
// and TPOT against concurrency on a log2 axis). All three are built from the same SweepResult.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "client/serve_bench.h"

namespace kiln::client {

nlohmann::json summary_to_json(const Summary& s);
nlohmann::json level_to_json(const LevelMetrics& m);
nlohmann::json sweep_to_json(const SweepOptions& opt, const SweepResult& r, const std::string& model);

std::string sweep_to_markdown(const SweepOptions& opt, const SweepResult& r, const std::string& model);

// Three panels side by side; invalid levels are drawn as hollow red points and named in the legend.
std::string sweep_to_svg(const SweepResult& r, const std::string& title);

void write_text_file(const std::string& path, const std::string& text);

}  // namespace kiln::client
