#include "client/request.h"

#include <nlohmann/json.hpp>

#include "client/sse.h"
#include "kiln/error.h"

namespace kiln::client {

using json = nlohmann::json;

Api parse_api(const std::string& s) {
  if (s == "generate") return Api::generate;
  if (s == "completions") return Api::completions;
  KILN_FAIL("unknown API '", s, "' (expected generate or completions)");
}

const char* api_name(Api api) {
  return api == Api::generate ? "generate" : "completions";
}

std::string build_stream_body(const RequestSpec& spec, const StreamOptions& opt) {
  json body;
  if (opt.api == Api::generate) {
    if (!spec.input_ids.empty())
      body["input_ids"] = spec.input_ids;
    else
      body["text"] = spec.text;
    if (!spec.image_b64.empty()) body["image_data"] = spec.image_b64;
    body["sampling_params"] = {{"max_new_tokens", spec.output_len}, {"ignore_eos", true}, {"temperature", 0}};
    if (!opt.json_schema.empty()) body["sampling_params"]["json_schema"] = opt.json_schema;
    body["stream"] = true;
  } else {
    if (!opt.model.empty()) body["model"] = opt.model;
    if (!spec.input_ids.empty())
      body["prompt"] = spec.input_ids;
    else
      body["prompt"] = spec.text;
    body["max_tokens"] = spec.output_len;
    body["ignore_eos"] = true;
    body["temperature"] = 0;
    if (!opt.json_schema.empty())
      body["response_format"] = {
          {"type", "json_schema"},
          {"json_schema", {{"name", "bench"}, {"schema", json::parse(opt.json_schema)}}}};
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  return body.dump();
}

static int64_t int_or(const json& j, const char* key, int64_t def) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : def;
}

static std::string error_text(const json& j) {
  const json& e = j.at("error");
  if (e.is_string()) return e.get<std::string>();
  if (e.is_object() && e.contains("message") && e["message"].is_string())
    return e["message"].get<std::string>();
  return e.dump();
}

void StreamAccumulator::output_chunk(double t_s) {
  if (first_s_ < 0)
    first_s_ = t_s;
  else
    itl_s_.push_back(t_s - last_s_);
  last_s_ = t_s;
  ++chunks_;
}

void StreamAccumulator::on_data(const std::string& data, double t_s) {
  if (!error_.empty() || done_) return;
  if (data == "[DONE]") {
    done_ = true;
    return;
  }
  const json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    error_ = "malformed stream chunk: " + data.substr(0, 200);
    return;
  }
  if (j.contains("error") && !j["error"].is_null()) {
    error_ = "server error in stream: " + error_text(j);
    return;
  }
  if (api_ == Api::generate) {
    const json meta = j.value("meta_info", json::object());
    const int64_t pt = int_or(meta, "prompt_tokens", -1);
    const int64_t ct = int_or(meta, "completion_tokens", -1);
    if (pt >= 0) prompt_tokens_ = pt;
    if (ct > std::max<int64_t>(completion_tokens_, 0)) output_chunk(t_s);
    if (ct >= 0) completion_tokens_ = ct;
  } else {
    const auto choices = j.find("choices");
    if (choices != j.end() && choices->is_array() && !choices->empty()) {
      const json& c = (*choices)[0];
      if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty())
        output_chunk(t_s);
    }
    const auto usage = j.find("usage");
    if (usage != j.end() && usage->is_object()) {
      prompt_tokens_ = int_or(*usage, "prompt_tokens", prompt_tokens_);
      completion_tokens_ = int_or(*usage, "completion_tokens", completion_tokens_);
    }
  }
}

void StreamAccumulator::finish(double end_s, RequestResult& out) const {
  out.prompt_tokens = prompt_tokens_;
  out.completion_tokens = completion_tokens_;
  out.ttft_s = first_s_;
  out.e2e_s = end_s;
  out.itl_s = itl_s_;
  out.output_chunks = chunks_;
  out.error = error_;
  if (out.error.empty() && !done_) out.error = "stream ended without 'data: [DONE]'";
  if (out.error.empty() && (prompt_tokens_ < 0 || completion_tokens_ < 0))
    out.error = api_ == Api::generate ? "stream carried no meta_info.prompt_tokens/completion_tokens"
                                      : "stream carried no usage (stream_options.include_usage unsupported?)";
  out.ok = out.error.empty();
}

RequestResult run_stream_request(HttpClient& http, const RequestSpec& spec, const StreamOptions& opt,
                                 std::chrono::steady_clock::time_point t0) {
  using clock = std::chrono::steady_clock;
  RequestResult out;
  const std::string body = build_stream_body(spec, opt);
  const auto sent = clock::now();
  out.start_s = std::chrono::duration<double>(sent - t0).count();
  auto since_sent = [&] { return std::chrono::duration<double>(clock::now() - sent).count(); };
  StreamAccumulator acc(opt.api);
  double t_piece = 0;
  SseParser parser([&](const SseEvent& e) { acc.on_data(e.data, t_piece); });
  const HttpResponse r = http.post_stream(opt.api == Api::generate ? "/generate" : "/v1/completions", body,
                                          [&](std::string_view piece) {
                                            t_piece = since_sent();
                                            parser.feed(piece);
                                            return true;
                                          });
  parser.finish();
  acc.finish(since_sent(), out);
  if (!r.error.empty()) {
    out.ok = false;
    out.error = "transport: " + r.error;
  } else if (r.status != 200) {
    out.ok = false;
    out.error = "HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 300);
  }
  return out;
}

std::string check_accounting(const RequestSpec& spec, const RequestResult& r) {
  if (!r.ok) return r.error;
  if (spec.expected_input >= 0 && r.prompt_tokens != spec.expected_input)
    return "prompt_tokens " + std::to_string(r.prompt_tokens) + " != asked " +
           std::to_string(spec.expected_input);
  if (r.completion_tokens != spec.output_len)
    return "completion_tokens " + std::to_string(r.completion_tokens) + " != asked " +
           std::to_string(spec.output_len);
  return "";
}

}  // namespace kiln::client
