#include "server/metrics_compat.h"

#include <array>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::server {

namespace {

constexpr std::array<std::pair<std::string_view, std::string_view>, 17> kVllmNames = {{
    {"kiln_num_running_requests", "vllm:num_requests_running"},
    {"kiln_num_waiting_requests", "vllm:num_requests_waiting"},
    {"kiln_kv_usage_ratio", "vllm:kv_cache_usage_perc"},
    {"kiln_kv_usage_ratio", "vllm:gpu_cache_usage_perc"},
    {"kiln_prompt_tokens_total", "vllm:prompt_tokens_total"},
    {"kiln_generation_tokens_total", "vllm:generation_tokens_total"},
    {"kiln_prompt_tokens_total", "vllm:prefix_cache_queries_total"},
    {"kiln_cached_tokens_total", "vllm:prefix_cache_hits_total"},
    {"kiln_preemptions_total", "vllm:num_preemptions_total"},
    {"kiln_requests_finished_total", "vllm:request_success_total"},
    {"kiln_time_to_first_token_seconds", "vllm:time_to_first_token_seconds"},
    {"kiln_time_per_output_token_seconds", "vllm:time_per_output_token_seconds"},
    {"kiln_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds"},
    // vLLM's counters vllm:spec_decode_num_* as prometheus_client exposes them (with _total).
    {"kiln_spec_decode_drafts_total", "vllm:spec_decode_num_drafts_total"},
    {"kiln_spec_decode_draft_tokens_total", "vllm:spec_decode_num_draft_tokens_total"},
    {"kiln_spec_decode_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"},
    {"kiln_spec_decode_accepted_tokens_per_pos_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total"},
}};

// The metric name a line is about: after "# HELP " / "# TYPE ", else up to '{' or ' '.
std::string_view line_name(std::string_view line, size_t& at) {
  at = 0;
  if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0)
    at = 7;
  else if (!line.empty() && line[0] == '#')
    return {};
  const size_t end = line.find_first_of("{ ", at);
  return line.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
}

}  // namespace

std::string vllm_metrics(const std::string& kiln_text) {
  std::vector<std::string_view> lines;
  std::string_view text(kiln_text);
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  std::string out;
  // Family by family, so each family's lines stay together as the text format requires.
  for (const auto& [from, to] : kVllmNames) {
    for (std::string_view line : lines) {
      size_t at = 0;
      const std::string_view name = line_name(line, at);
      std::string_view suffix;
      if (name == from) {
        suffix = "";
      } else if (name.size() > from.size() && name.substr(0, from.size()) == from &&
                 (name.substr(from.size()) == "_bucket" || name.substr(from.size()) == "_sum" ||
                  name.substr(from.size()) == "_count")) {
        suffix = name.substr(from.size());
      } else {
        continue;
      }
      std::string renamed = std::string(line.substr(0, at)) + std::string(to) + std::string(suffix) +
                            std::string(line.substr(at + name.size()));
      if (to == "vllm:request_success_total")  // vLLM's label name
        if (const size_t r = renamed.find(",reason=\""); r != std::string::npos)
          renamed.replace(r + 1, 6, "finished_reason");
      out += renamed;
      out += '\n';
    }
  }
  return out;
}

}  // namespace kiln::server
