// One streamed generation request against an OpenAI-compatible or SGLang-style server, timed per chunk.
//
// Two request shapes:
//   Api::generate     POST /generate  {"input_ids"|"text", "sampling_params": {max_new_tokens, ignore_eos,
//                     temperature: 0, json_schema?}, "stream": true}; each SSE chunk carries cumulative
//                     meta_info.prompt_tokens / meta_info.completion_tokens (SGLang's convention).
//   Api::completions  POST /v1/completions {"prompt": ids or text, max_tokens, ignore_eos, temperature: 0,
//                     response_format?, "stream": true, "stream_options": {"include_usage": true}}; the
//                     counts come from the final chunk's "usage".
// Timing: TTFT is the arrival of the first chunk that carries output (a completion_tokens increase, or
// non-empty choices[0].text); ITL are the gaps between such chunks; E2E ends at the stream's end.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "client/http.h"

namespace kiln::client {

enum class Api { generate, completions };
Api parse_api(const std::string& s);  // "generate" | "completions"
const char* api_name(Api api);

struct RequestSpec {
  std::vector<int32_t> input_ids;  // token-id prompt; when empty, `text` is the prompt
  std::string text;
  int64_t expected_input = -1;  // prompt tokens the server must report; -1: unknown (text prompt)
  int64_t output_len = 0;       // exact output tokens asked for (ignore_eos)
  // Api::generate: one image sent as image_data (base64); input_ids then hold its placeholder tokens.
  std::string image_b64;
};

struct RequestResult {
  bool ok = false;             // HTTP 200, a well-formed stream, [DONE] seen, counts reported
  std::string error;           // why not ok
  int64_t prompt_tokens = -1;  // as reported by the server
  int64_t completion_tokens = -1;
  double start_s = 0;  // send time, seconds after the run's t0
  double ttft_s = -1;  // -1 when no output chunk arrived
  double e2e_s = -1;
  std::vector<double> itl_s;  // gaps between output chunks
  int64_t output_chunks = 0;
};

struct StreamOptions {
  Api api = Api::generate;
  std::string model;  // "model" field of /v1/completions; empty: omitted
  // A JSON Schema (its text; empty: none) constraining every request: /generate's sampling_params.json_schema
  // (SGLang), /v1/completions' response_format json_schema (OpenAI).
  std::string json_schema;
};

std::string build_stream_body(const RequestSpec& spec, const StreamOptions& opt);

// Consumes the SSE "data:" payloads of one request. Never throws: malformed payloads become an error.
class StreamAccumulator {
 public:
  explicit StreamAccumulator(Api api) : api_(api) {}
  void on_data(const std::string& data, double t_s);  // t_s: seconds since the request was sent
  // Fills the result's counts, timings and ok/error from what was seen; end_s is the stream's end.
  void finish(double end_s, RequestResult& out) const;

 private:
  void output_chunk(double t_s);

  Api api_;
  bool done_ = false;
  std::string error_;
  int64_t prompt_tokens_ = -1, completion_tokens_ = -1;
  double first_s_ = -1, last_s_ = -1;
  std::vector<double> itl_s_;
  int64_t chunks_ = 0;
};

// Sends the request and reads the stream to its end. Transport and server errors land in the result.
RequestResult run_stream_request(HttpClient& http, const RequestSpec& spec, const StreamOptions& opt,
                                 std::chrono::steady_clock::time_point t0);

// Exact accounting: empty when the server reported exactly the asked input and output token counts
// (input is checked only when expected_input >= 0), otherwise the reason.
std::string check_accounting(const RequestSpec& spec, const RequestResult& r);

}  // namespace kiln::client
