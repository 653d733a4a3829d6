// --metrics-compat vllm: the kiln_* metrics also exported under the names vLLM's reference Grafana dashboard
// (examples/online_serving/prometheus_grafana) and its docs read, with vLLM's model_name label. Derived from
// the kiln exposition text, so both always agree. Mapping (vLLM <- kiln):
//   vllm:num_requests_running            <- kiln_num_running_requests
//   vllm:num_requests_waiting            <- kiln_num_waiting_requests
//   vllm:kv_cache_usage_perc, vllm:gpu_cache_usage_perc (its pre-V1 name) <- kiln_kv_usage_ratio (0..1)
//   vllm:prompt_tokens_total             <- kiln_prompt_tokens_total
//   vllm:generation_tokens_total         <- kiln_generation_tokens_total
//   vllm:prefix_cache_queries_total      <- kiln_prompt_tokens_total (tokens looked up)
//   vllm:prefix_cache_hits_total         <- kiln_cached_tokens_total (tokens found)
//   vllm:num_preemptions_total           <- kiln_preemptions_total
//   vllm:request_success_total{finished_reason} <- kiln_requests_finished_total{reason}
//   vllm:time_to_first_token_seconds     <- kiln_time_to_first_token_seconds (histogram)
//   vllm:time_per_output_token_seconds   <- kiln_time_per_output_token_seconds (histogram; kiln observes
//                                           each request's mean, vLLM each token's gap)
//   vllm:e2e_request_latency_seconds     <- kiln_e2e_request_latency_seconds (histogram)
// Not exported (kiln does not measure them): the request_prompt_tokens / request_generation_tokens
// histograms, request_queue_time_seconds, request_prefill_time_seconds, request_decode_time_seconds.
#pragma once

#include <string>

namespace kiln::server {

// The vLLM-named families for a kiln exposition text (render_metrics' output), to append to it.
std::string vllm_metrics(const std::string& kiln_text);

}  // namespace kiln::server
