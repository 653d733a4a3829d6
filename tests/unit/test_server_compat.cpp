// The pieces behind issue 46's compatibility routes, without HTTP: model names, CORS, the chat render
// fields of protocol_fields.h, and the Responses output builder's items and events.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "kiln/error.h"
#include "server/api_error.h"
#include "server/cors.h"
#include "server/metrics.h"
#include "server/metrics_compat.h"
#include "server/model_names.h"
#include "server/protocol_fields.h"
#include "server/responses_api.h"

using namespace kiln;
using namespace kiln::server;
using nlohmann::json;

TEST(ModelNames, ServedListedPathAndBasenameAccepted) {
  const ModelNames m = make_model_names({"a", "b", "a"}, "/ckpt/Qwen3-4B/");
  EXPECT_EQ(m.served, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(m.primary(), "a");
  EXPECT_TRUE(m.accepts("/ckpt/Qwen3-4B/"));
  EXPECT_TRUE(m.accepts("Qwen3-4B"));
  EXPECT_FALSE(m.accepts("Qwen3-8B"));
  const ModelNames d = make_model_names({}, "models/Qwen3-0.6B");
  EXPECT_EQ(d.served, (std::vector<std::string>{"Qwen3-0.6B"}));
  EXPECT_EQ(d.accepted, (std::vector<std::string>{"models/Qwen3-0.6B"}));
  EXPECT_EQ(make_model_names({}, ".").primary(), "kiln");
  const json e = model_not_found_body("x", m);
  EXPECT_EQ(e["error"]["code"], "model_not_found");
  EXPECT_EQ(e["error"]["param"], "model");
}

TEST(Cors, OriginsParsedAndPreflightAnswered) {
  EXPECT_EQ(parse_allowed_origins("[\"https://a\", \"https://b\"]"),
            (std::vector<std::string>{"https://a", "https://b"}));
  EXPECT_EQ(parse_allowed_origins("https://a, https://b"),
            (std::vector<std::string>{"https://a", "https://b"}));
  EXPECT_TRUE(parse_allowed_origins("[]").empty());
  EXPECT_THROW(parse_allowed_origins("[1]"), kiln::Error);
  EXPECT_THROW(parse_allowed_origins("[\"a\""), kiln::Error);

  CorsPolicy p;
  p.allowed_origins = {"https://a"};
  HttpRequest pre;
  pre.method = "OPTIONS";
  pre.headers = {{"Origin", "https://a"},
                 {"Access-Control-Request-Method", "POST"},
                 {"Access-Control-Request-Headers", "authorization"}};
  auto r = p.preflight(pre);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  auto header = [](const HttpResponse& res, const std::string& k) {
    for (const auto& [n, v] : res.headers)
      if (n == k) return v;
    return std::string();
  };
  EXPECT_EQ(header(*r, "Access-Control-Allow-Origin"), "https://a");
  EXPECT_EQ(header(*r, "Access-Control-Allow-Headers"), "authorization");
  pre.headers[0].second = "https://b";
  EXPECT_EQ(p.preflight(pre)->status, 400);
  HttpRequest get;
  get.method = "GET";
  EXPECT_FALSE(p.preflight(get));
  HttpResponse res;
  p.decorate(get, res);  // no Origin: nothing added
  EXPECT_TRUE(res.headers.empty());
  get.headers = {{"Origin", "https://a"}};
  p.decorate(get, res);
  EXPECT_EQ(header(res, "Access-Control-Allow-Origin"), "https://a");
  CorsPolicy off;
  off.allowed_origins.clear();
  HttpResponse res2;
  off.decorate(get, res2);
  EXPECT_TRUE(res2.headers.empty());
}

TEST(ProtocolFields, RenderFieldsAndContinueFinalMessage) {
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  json norm = body;
  EXPECT_FALSE(apply_chat_render_fields(body, norm));
  EXPECT_EQ(norm["chat_template_kwargs"]["add_generation_prompt"], true);
  body["add_generation_prompt"] = false;
  norm = body;
  apply_chat_render_fields(body, norm);
  EXPECT_EQ(norm["chat_template_kwargs"]["add_generation_prompt"], false);
  // continue_final_message needs a final assistant message, and not add_generation_prompt true.
  body["continue_final_message"] = true;
  norm = body;
  EXPECT_THROW(apply_chat_render_fields(body, norm), ApiError);
  body["messages"].push_back({{"role", "assistant"}, {"content", "The answer is"}});
  norm = body;
  EXPECT_TRUE(apply_chat_render_fields(body, norm));
  const std::string rendered =
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nThe answer is<|im_end|>\n";
  EXPECT_EQ(cut_after_final_message(rendered, norm["messages"]),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nThe answer is");
  body["add_generation_prompt"] = true;
  EXPECT_THROW(apply_chat_render_fields(body, norm), ApiError);
  // reasoning_effort: checked, handed to the template; none turns thinking off.
  json re = {{"messages", json::array()}, {"reasoning_effort", "none"}};
  json rn = re;
  apply_chat_render_fields(re, rn);
  EXPECT_EQ(rn["chat_template_kwargs"]["enable_thinking"], false);
  EXPECT_EQ(rn["chat_template_kwargs"]["reasoning_effort"], "none");
  re["reasoning_effort"] = "max";
  EXPECT_THROW(apply_chat_render_fields(re, rn), ApiError);
}

TEST(ProtocolFields, ToolsValidated) {
  const json ok =
      json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}}});
  EXPECT_NO_THROW(validate_tools(&ok));
  for (const json& bad :
       {json::array({{{"type", "code_interpreter"}}}),
        json::array({{{"type", "function"}, {"function", {{"parameters", json::object()}}}}}),
        json::array({{{"type", "function"}, {"function", {{"name", ""}}}}}),
        json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", 3}}}}})}) {
    try {
      validate_tools(&bad);
      ADD_FAILURE() << bad.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param().rfind("tools[0]", 0), 0u) << e.param();
    }
  }
}

TEST(ResponsesBuilder, ItemsAndEventsInOrder) {
  ResponseOutputBuilder b("resp_abc", /*stream=*/true);
  std::string out;
  ParsedDelta d1;
  d1.reasoning = "think";
  b.feed(d1, out);
  ParsedDelta d2;
  d2.content = "Hel";
  b.feed(d2, out);
  ParsedDelta d3;
  d3.content = "lo";
  d3.tool_calls.push_back({0, "call_1", "f", "{\"x\":1}"});
  b.feed(d3, out);
  b.close(out);
  const json& items = b.items();
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0]["type"], "reasoning");
  EXPECT_EQ(items[0]["summary"][0]["text"], "think");
  EXPECT_EQ(items[1]["content"][0]["text"], "Hello");
  EXPECT_EQ(items[1]["status"], "completed");
  EXPECT_EQ(items[2]["type"], "function_call");
  EXPECT_EQ(items[2]["arguments"], "{\"x\":1}");
  // The event types in order, each frame "event: T\ndata: {...}\n\n" with sequence numbers 0, 1, ...
  std::vector<std::string> types;
  size_t pos = 0;
  int64_t seq = 0;
  while ((pos = out.find("event: ", pos)) != std::string::npos) {
    const size_t nl = out.find('\n', pos);
    types.push_back(out.substr(pos + 7, nl - pos - 7));
    const size_t end = out.find("\n\n", nl);
    const json data = json::parse(out.substr(nl + 7, end - nl - 7));
    EXPECT_EQ(data["type"], types.back());
    EXPECT_EQ(data["sequence_number"], seq++);
    pos = end;
  }
  const std::vector<std::string> want = {"response.output_item.added",
                                         "response.reasoning_summary_part.added",
                                         "response.reasoning_summary_text.delta",
                                         "response.reasoning_summary_text.done",
                                         "response.reasoning_summary_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",
                                         "response.content_part.added",
                                         "response.output_text.delta",
                                         "response.output_text.delta",
                                         "response.output_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.output_item.added",
                                         "response.function_call_arguments.delta",
                                         "response.function_call_arguments.done",
                                         "response.output_item.done"};
  EXPECT_EQ(types, want);
  const json msg = b.assistant_message();
  EXPECT_EQ(msg["content"], "Hello");
  EXPECT_EQ(msg["tool_calls"][0]["id"], "call_1");
  // Not streaming: the same items, no bytes.
  ResponseOutputBuilder q("resp_abc", false);
  std::string none;
  q.feed(d1, none);
  q.close(none);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(q.items().size(), 1u);
}

TEST(ProtocolFields, ParallelToolCallsFalseKeepsTheFirstCall) {
  EXPECT_EQ(max_tool_calls(json{{"parallel_tool_calls", false}}), 1);
  EXPECT_EQ(max_tool_calls(json::object()), 0);
  const std::string text =
      "a<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", "
      "\"arguments\": {}}\n</tool_call>";
  for (int max : {0, 1}) {
    ParserOptions o;
    o.tools = true;
    o.max_calls = max;
    OutputParser p(o);
    ParsedDelta d = p.feed(text);
    d.append(p.finish());
    ASSERT_EQ(d.tool_calls.size(), max == 1 ? 1u : 2u);
    EXPECT_EQ(d.tool_calls[0].name, "f");
    EXPECT_EQ(d.content, "a");
    EXPECT_EQ(p.tool_call_count(), max == 1 ? 1 : 2);
  }
}

TEST(MetricsCompat, VllmNamesFromKilnText) {
  EngineStats s;
  s.running = 3;
  s.waiting = 2;
  s.kv_pages_total = 10;
  s.kv_pages_used = 5;
  s.finished_stop = 7;
  s.finished_length = 1;
  s.ttft = Histogram::with_bounds({0.1, 1.0});
  s.ttft.observe(0.05);
  s.ttft.observe(0.5);
  s.spec.observe_row(3, 2);
  s.spec.observe_row(2, 0);
  s.spec.draft_seconds = 0.25;
  s.spec.draft_chain_seconds = 0.125;
  s.spec.verify_step_seconds = 1.5;
  s.spec.timed_verify_steps = 3;
  s.spec.plain_step_seconds = 0.75;
  s.spec.timed_plain_steps = 6;
  s.spec.ragged_verify_steps = 2;
  s.spec.indexed_during_forward = 4096;
  s.spec.index_during_forward_seconds = 0.0625;
  ServerCounters c;
  const std::string kiln = render_metrics(s, c, "demo");
  const std::string v = vllm_metrics(kiln);
  // Speculative decoding: vLLM's counters, the per-position one labelled by position.
  EXPECT_NE(v.find("# TYPE vllm:spec_decode_num_drafts_total counter\n"
                   "vllm:spec_decode_num_drafts_total{model_name=\"demo\"} 2\n"),
            std::string::npos)
      << v;
  EXPECT_NE(v.find("vllm:spec_decode_num_draft_tokens_total{model_name=\"demo\"} 5\n"), std::string::npos);
  EXPECT_NE(v.find("vllm:spec_decode_num_accepted_tokens_total{model_name=\"demo\"} 2\n"), std::string::npos);
  EXPECT_NE(
      v.find("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"demo\",position=\"0\"} 1\n"
             "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"demo\",position=\"1\"} 1\n"
             "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"demo\",position=\"2\"} 0\n"),
      std::string::npos)
      << v;
  EXPECT_NE(kiln.find("kiln_spec_decode_acceptance_rate{model_name=\"demo\"} 0.4\n"), std::string::npos)
      << kiln;
  EXPECT_NE(kiln.find("kiln_spec_decode_mean_acceptance_length{model_name=\"demo\"} 2\n"), std::string::npos);
  for (const char* series :
       {"kiln_spec_decode_draft_seconds_total{model_name=\"demo\"} 0.25\n",
        "kiln_spec_decode_draft_chain_seconds_total{model_name=\"demo\"} 0.125\n",
        "kiln_spec_decode_verify_step_seconds_total{model_name=\"demo\"} 1.5\n",
        "kiln_spec_decode_timed_verify_steps_total{model_name=\"demo\"} 3\n",
        "kiln_spec_decode_plain_step_seconds_total{model_name=\"demo\"} 0.75\n",
        "kiln_spec_decode_timed_plain_steps_total{model_name=\"demo\"} 6\n",
        "kiln_spec_decode_ragged_verify_steps_total{model_name=\"demo\"} 2\n",
        "kiln_spec_decode_indexed_during_forward_tokens_total{model_name=\"demo\"} 4096\n",
        "kiln_spec_decode_index_during_forward_seconds_total{model_name=\"demo\"} 0.0625\n"})
    EXPECT_NE(kiln.find(series), std::string::npos) << series << kiln;
  EXPECT_NE(
      v.find("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"demo\"} 3\n"),
      std::string::npos)
      << v;
  EXPECT_NE(v.find("vllm:num_requests_waiting{model_name=\"demo\"} 2\n"), std::string::npos);
  EXPECT_NE(v.find("vllm:request_success_total{model_name=\"demo\",finished_reason=\"stop\"} 7\n"),
            std::string::npos);
  EXPECT_NE(v.find("vllm:time_to_first_token_seconds_bucket{model_name=\"demo\",le=\"0.1\"} 1\n"),
            std::string::npos)
      << v;
  EXPECT_NE(v.find("vllm:time_to_first_token_seconds_count{model_name=\"demo\"} 2\n"), std::string::npos);
  EXPECT_EQ(v.find("kiln_"), std::string::npos);  // only renamed families
  // Each family's lines are contiguous: a name never reappears after another family started.
  std::vector<std::string> order;
  std::istringstream is(v);
  for (std::string line; std::getline(is, line);) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    const std::string name = line.substr(7, line.find(' ', 7) - 7);
    EXPECT_EQ(std::count(order.begin(), order.end(), name), 0) << name;
    order.push_back(name);
  }
  EXPECT_EQ(order.size(), 17u);
}

TEST(ResponsesStore, BoundedOldestFirst) {
  ResponseStore s(2);
  s.put("a", {json{{"id", "a"}}, json::array()});
  s.put("b", {json{{"id", "b"}}, json::array()});
  s.put("c", {json{{"id", "c"}}, json::array()});
  EXPECT_FALSE(s.get("a"));
  EXPECT_TRUE(s.get("b"));
  EXPECT_EQ(s.get("c")->response["id"], "c");
  ResponseStore none(0);
  none.put("a", {json::object(), json::array()});
  EXPECT_FALSE(none.get("a"));
}
