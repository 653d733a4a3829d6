#include "server/responses_api.h"

#include "server/api_error.h"
#include "server/protocol_fields.h"
#include "server/responses.h"

namespace kiln::server {

using nlohmann::json;

namespace {

const json* given(const json& obj, const char* name) {
  return given_field(obj, name);
}

std::string str_field(const json& obj, const char* name, const std::string& param) {
  const json* v = given(obj, name);
  if (!v || !v->is_string())
    throw bad_request("'" + param + "." + name + "' must be a string", param + "." + name);
  return v->get<std::string>();
}

// A message item's content: a string, or parts (input_text / output_text -> text, input_image -> an
// image_url part the chat route reads).
json message_content(const json& content, const std::string& p) {
  if (content.is_string()) return content;
  if (!content.is_array())
    throw bad_request("'" + p + ".content' must be a string or a list of parts", p + ".content");
  json parts = json::array();
  bool images = false;
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const json& part = content[k];
    const std::string pp = p + ".content[" + std::to_string(k) + "]";
    if (!part.is_object()) throw bad_request("'" + pp + "' must be an object", pp);
    const std::string type = part.value("type", "");
    if (type == "input_text" || type == "output_text" || type == "text") {
      const std::string t = str_field(part, "text", pp);
      text += t;
      parts.push_back({{"type", "text"}, {"text", t}});
    } else if (type == "input_image") {
      const json* url = given(part, "image_url");
      if (!url || !url->is_string())
        throw bad_request("'" + pp + ".image_url' must be a URL string (file_id is not supported)",
                          pp + ".image_url");
      parts.push_back({{"type", "image_url"}, {"image_url", {{"url", *url}}}});
      images = true;
    } else {
      throw bad_request(
          "'" + pp + ".type' must be input_text, output_text or input_image; got '" + type + "'",
          pp + ".type");
    }
  }
  return images ? parts : json(text);
}

// input items -> chat messages; consecutive function_call items become one assistant turn with tool_calls.
void append_input(const json& input, json& msgs) {
  if (input.is_string()) {
    msgs.push_back({{"role", "user"}, {"content", input}});
    return;
  }
  if (!input.is_array()) throw bad_request("'input' must be a string or a list of items", "input");
  for (size_t i = 0; i < input.size(); ++i) {
    const json& it = input[i];
    const std::string p = "input[" + std::to_string(i) + "]";
    if (!it.is_object()) throw bad_request("'" + p + "' must be an object", p);
    const std::string type = it.value("type", it.contains("role") ? "message" : "");
    if (type == "message") {
      const std::string role = str_field(it, "role", p);
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        throw bad_request("'" + p + ".role' must be user, system, developer or assistant", p + ".role");
      const json* content = given(it, "content");
      if (!content) throw bad_request("'" + p + ".content' is required", p + ".content");
      msgs.push_back({{"role", role}, {"content", message_content(*content, p)}});
    } else if (type == "function_call") {
      const json call = {
          {"id", str_field(it, "call_id", p)},
          {"type", "function"},
          {"function", {{"name", str_field(it, "name", p)}, {"arguments", str_field(it, "arguments", p)}}}};
      if (!msgs.empty() && msgs.back()["role"] == "assistant" && msgs.back().contains("tool_calls"))
        msgs.back()["tool_calls"].push_back(call);
      else
        msgs.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call})}});
    } else if (type == "function_call_output") {
      const json* out = given(it, "output");
      if (!out) throw bad_request("'" + p + ".output' is required", p + ".output");
      msgs.push_back({{"role", "tool"},
                      {"tool_call_id", str_field(it, "call_id", p)},
                      {"content", out->is_string() ? out->get<std::string>() : out->dump()}});
    } else if (type == "reasoning") {
      continue;  // past reasoning: Qwen3's template drops it from earlier turns
    } else {
      throw bad_request(
          "'" + p + ".type' must be message, function_call, function_call_output or reasoning; got '" + type +
              "'",
          p + ".type");
    }
  }
}

// The flat Responses tool shape -> the chat route's {"type": "function", "function": {...}}.
json chat_tools(const json& tools) {
  if (!tools.is_array()) throw bad_request("'tools' must be a list", "tools");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || t.value("type", "") != "function")
      throw bad_request("'" + p + ".type' must be \"function\" (kiln runs no built-in tools)", p + ".type");
    json fn = {{"name", given(t, "name") ? t["name"] : json(nullptr)}};
    for (const char* k : {"description", "parameters"})
      if (const json* v = given(t, k)) fn[k] = *v;
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return out;
}

json chat_tool_choice(const json& tc) {
  if (tc.is_object() && tc.value("type", "") == "function")
    return {{"type", "function"}, {"function", {{"name", tc.value("name", "")}}}};
  return tc;
}

}  // namespace

void ResponseStore::put(const std::string& id, StoredResponse r) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  while (order_.size() >= capacity_) {
    by_id_.erase(order_.front());
    order_.pop_front();
  }
  order_.push_back(id);
  by_id_[id] = std::move(r);
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second;
}

ResponsesSpec parse_responses_request(const json& body, const ResponseStore& store, const TextCodec& codec,
                                      const ApiLimits& lim) {
  ResponsesSpec s;
  if (const json* v = given(body, "include"); v && !(v->is_array() && v->empty()))
    throw bad_request("'include' is not supported", "include");
  if (const json* v = given(body, "background"); v && *v != json(false))
    throw bad_request("'background' responses are not supported", "background");
  if (const json* v = given(body, "truncation"); v && *v != json("disabled"))
    throw bad_request("'truncation' must be \"disabled\": kiln does not drop input items to fit",
                      "truncation");
  json response_format;  // text.format as chat's response_format (structured_output.h)
  if (const json* t = given(body, "text")) {
    if (!t->is_object()) throw bad_request("'text' must be an object", "text");
    if (const json* f = given(*t, "format")) {
      if (!f->is_object() || !f->contains("type") || !(*f)["type"].is_string())
        throw bad_request("'text.format' must be an object with a 'type'", "text.format");
      const std::string type = (*f)["type"].get<std::string>();
      if (type == "json_schema") {
        json js = {{"schema", f->value("schema", json())}};
        for (const char* k : {"name", "strict"})
          if (const json* v = given(*f, k)) js[k] = *v;
        response_format = {{"type", "json_schema"}, {"json_schema", js}};
      } else if (type == "json_object") {
        response_format = {{"type", "json_object"}};
      } else if (type != "text") {
        throw bad_request(
            "'text.format' type must be \"text\", \"json_object\" or \"json_schema\", got '" + type + "'",
            "text.format");
      }
    }
  }
  json msgs = json::array();
  if (const json* prev = given(body, "previous_response_id")) {
    if (!prev->is_string())
      throw bad_request("'previous_response_id' must be a string", "previous_response_id");
    auto stored = store.get(prev->get<std::string>());
    if (!stored)
      throw ApiError(404,
                     "Previous response with id '" + prev->get<std::string>() +
                         "' not found (responses are kept in memory, the last " +
                         std::to_string(store.capacity()) + ", and only with store true)",
                     "previous_response_id");
    msgs = stored->conversation;
  }
  const json* input = given(body, "input");
  if (!input) throw bad_request("'input' is required", "input");
  append_input(*input, msgs);
  s.conversation = msgs;

  json chat = {{"messages", json::array()}};
  if (const json* ins = given(body, "instructions")) {
    if (!ins->is_string()) throw bad_request("'instructions' must be a string", "instructions");
    chat["messages"].push_back({{"role", "system"}, {"content", *ins}});
  }
  for (const auto& m : msgs) chat["messages"].push_back(m);
  for (const char* k : {"model", "temperature", "top_p", "parallel_tool_calls", "stream"})
    if (const json* v = given(body, k)) chat[k] = *v;
  if (const json* v = given(body, "max_output_tokens")) chat["max_tokens"] = *v;
  if (const json* v = given(body, "tools")) chat["tools"] = chat_tools(*v);
  if (const json* v = given(body, "tool_choice")) chat["tool_choice"] = chat_tool_choice(*v);
  if (!response_format.is_null()) chat["response_format"] = response_format;
  if (const json* r = given(body, "reasoning")) {
    if (!r->is_object()) throw bad_request("'reasoning' must be an object", "reasoning");
    if (const json* e = given(*r, "effort")) chat["reasoning_effort"] = *e;
  }
  try {
    s.gen = parse_chat_request(chat, codec, lim);
  } catch (const ApiError& e) {  // name the Responses field, not the chat one it became
    std::string param = e.param();
    if (param == "max_tokens") param = "max_output_tokens";
    if (param == "reasoning_effort") param = "reasoning.effort";
    if (param.rfind("messages", 0) == 0) param = "input";
    if (param.rfind("response_format", 0) == 0) param = "text.format";
    if (const size_t f = param.find(".function"); param.rfind("tools[", 0) == 0 && f != std::string::npos)
      param.erase(f, 9);  // the flat tool shape has no "function" level
    throw ApiError(e.status(), e.what(), param, e.type(), e.code());
  }
  if (const json* v = given(body, "store")) {
    if (!v->is_boolean()) throw bad_request("'store' must be a boolean", "store");
    s.store = v->get<bool>();
  }
  s.echo = {
      {"instructions",
       chat["messages"].size() > msgs.size() ? chat["messages"][0]["content"] : json(nullptr)},
      {"max_output_tokens", given(body, "max_output_tokens") ? body["max_output_tokens"] : json(nullptr)},
      {"parallel_tool_calls", body.value("parallel_tool_calls", json(true))},
      {"previous_response_id",
       given(body, "previous_response_id") ? body["previous_response_id"] : json(nullptr)},
      {"reasoning",
       {{"effort",
         given(body, "reasoning") ? body["reasoning"].value("effort", json(nullptr)) : json(nullptr)},
        {"summary", nullptr}}},
      {"temperature", given(body, "temperature") ? body["temperature"] : json(1.0)},
      {"top_p", given(body, "top_p") ? body["top_p"] : json(1.0)},
      {"tool_choice", given(body, "tool_choice") ? body["tool_choice"] : json("auto")},
      {"tools", given(body, "tools") ? body["tools"] : json::array()},
      {"metadata", given(body, "metadata") ? body["metadata"] : json::object()},
      {"user", given(body, "user") ? body["user"] : json(nullptr)}};
  return s;
}

std::string ResponseOutputBuilder::item_id(const char* prefix) {
  return std::string(prefix) + resp_id_.substr(resp_id_.find('_') + 1) + "_" + std::to_string(next_item_++);
}

void ResponseOutputBuilder::event(std::string& out, const char* type, json data) {
  if (!stream_) return;
  data["type"] = type;
  data["sequence_number"] = seq_++;
  out += "event: ";
  out += type;
  out += "\ndata: " + dump_json(data) + "\n\n";
}

void ResponseOutputBuilder::open(Open kind, std::string& out) {
  if (open_ == kind) return;
  close(out);
  open_ = kind;
  const int index = int(items_.size());
  json item;
  if (kind == Open::reasoning) {
    item = {{"id", item_id("rs_")}, {"type", "reasoning"}, {"summary", json::array()}};
    items_.push_back(item);
    event(out, "response.output_item.added", {{"output_index", index}, {"item", item}});
    event(out, "response.reasoning_summary_part.added",
          {{"item_id", item["id"]},
           {"output_index", index},
           {"summary_index", 0},
           {"part", {{"type", "summary_text"}, {"text", ""}}}});
  } else {
    item = {{"id", item_id("msg_")},
            {"type", "message"},
            {"role", "assistant"},
            {"status", "in_progress"},
            {"content", json::array()}};
    items_.push_back(item);
    event(out, "response.output_item.added", {{"output_index", index}, {"item", item}});
    event(out, "response.content_part.added",
          {{"item_id", item["id"]},
           {"output_index", index},
           {"content_index", 0},
           {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
  }
}

void ResponseOutputBuilder::close(std::string& out) {
  if (open_ == Open::none) return;
  const int index = int(items_.size()) - 1;
  json& item = items_.back();
  if (open_ == Open::reasoning) {
    const json part = {{"type", "summary_text"}, {"text", text_}};
    event(out, "response.reasoning_summary_text.done",
          {{"item_id", item["id"]}, {"output_index", index}, {"summary_index", 0}, {"text", text_}});
    event(out, "response.reasoning_summary_part.done",
          {{"item_id", item["id"]}, {"output_index", index}, {"summary_index", 0}, {"part", part}});
    item["summary"] = json::array({part});
  } else {
    const json part = {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}};
    event(out, "response.output_text.done",
          {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
    event(out, "response.content_part.done",
          {{"item_id", item["id"]}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    item["content"] = json::array({part});
    item["status"] = "completed";
  }
  event(out, "response.output_item.done", {{"output_index", index}, {"item", item}});
  open_ = Open::none;
  text_.clear();
}

void ResponseOutputBuilder::feed(const ParsedDelta& d, std::string& out) {
  if (!d.reasoning.empty()) {
    open(Open::reasoning, out);
    text_ += d.reasoning;
    event(out, "response.reasoning_summary_text.delta",
          {{"item_id", items_.back()["id"]},
           {"output_index", items_.size() - 1},
           {"summary_index", 0},
           {"delta", d.reasoning}});
  }
  if (!d.content.empty()) {
    open(Open::message, out);
    text_ += d.content;
    event(out, "response.output_text.delta",
          {{"item_id", items_.back()["id"]},
           {"output_index", items_.size() - 1},
           {"content_index", 0},
           {"delta", d.content},
           {"logprobs", json::array()}});
  }
  for (const ToolCall& c : d.tool_calls) {
    close(out);
    const int index = int(items_.size());
    json item = {{"id", item_id("fc_")}, {"type", "function_call"}, {"call_id", c.id},
                 {"name", c.name},       {"arguments", ""},         {"status", "in_progress"}};
    event(out, "response.output_item.added", {{"output_index", index}, {"item", item}});
    event(out, "response.function_call_arguments.delta",
          {{"item_id", item["id"]}, {"output_index", index}, {"delta", c.arguments}});
    event(out, "response.function_call_arguments.done",
          {{"item_id", item["id"]}, {"output_index", index}, {"arguments", c.arguments}});
    item["arguments"] = c.arguments;
    item["status"] = "completed";
    event(out, "response.output_item.done", {{"output_index", index}, {"item", item}});
    items_.push_back(std::move(item));
  }
}

json ResponseOutputBuilder::assistant_message() const {
  json msg = {{"role", "assistant"}, {"content", ""}};
  json calls = json::array();
  for (const auto& it : items_) {
    if (it["type"] == "message") msg["content"] = it["content"].empty() ? json("") : it["content"][0]["text"];
    if (it["type"] == "function_call")
      calls.push_back({{"id", it["call_id"]},
                       {"type", "function"},
                       {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}});
  }
  if (!calls.empty()) msg["tool_calls"] = calls;
  return msg;
}

json response_object(const std::string& id, int64_t created, const ResponsesSpec& spec, const json& output,
                     const OutputTracker* done) {
  json r = {{"id", id},
            {"object", "response"},
            {"created_at", created},
            {"status", "in_progress"},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"model", spec.gen.model},
            {"output", output},
            {"store", spec.store},
            {"text", {{"format", {{"type", "text"}}}}},
            {"truncation", "disabled"},
            {"usage", nullptr}};
  for (const auto& [k, v] : spec.echo.items()) r[k] = v;
  if (!done) return r;
  const std::string& fr = done->finish_reason();
  r["status"] = fr == "stop" ? "completed" : fr == "error" ? "failed" : "incomplete";
  if (fr == "length") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (fr == "abort") r["incomplete_details"] = {{"reason", "interrupted"}};
  if (fr == "error")
    r["error"] = {{"code", "server_error"}, {"message", "generation failed: " + done->error()}};
  r["usage"] = {{"input_tokens", done->prompt_tokens()},
                {"input_tokens_details", {{"cached_tokens", done->cached_tokens()}}},
                {"output_tokens", done->completion_tokens()},
                {"output_tokens_details", {{"reasoning_tokens", 0}}},
                {"total_tokens", done->prompt_tokens() + done->completion_tokens()}};
  return r;
}

}  // namespace kiln::server
