#include "server/structured_output.h"

#include <cctype>
#include <cstdio>

#include "kiln/error.h"
#include "server/api_error.h"
#include "server/protocol_fields.h"

namespace kiln::server {
namespace {

using grammar::GrammarKind;
// Ordered: a schema keeps its properties in the order the client wrote them, and the grammar generates them
// so.
using json = nlohmann::ordered_json;

constexpr size_t kMaxChoices = 1024;

const json* given(const json& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::string named(const std::string& field) {
  return "'" + field + "'";
}

// A JSON Schema given as an object or boolean, or as its JSON text (SGLang sends text): compact JSON.
std::string schema_text(const json& v, const std::string& field) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) {
    json parsed;
    try {
      parsed = json::parse(v.get<std::string>());
    } catch (const json::exception& e) {
      throw bad_request(named(field) + " is not valid JSON: " + e.what(), field);
    }
    if (parsed.is_object() || parsed.is_boolean()) return parsed.dump();
  }
  throw bad_request(named(field) + " must be a JSON Schema (an object or boolean, or its JSON text)", field);
}

std::string text_of(const json& v, const std::string& field) {
  if (!v.is_string() || v.get<std::string>().empty())
    throw bad_request(named(field) + " must be a non-empty string", field);
  return v.get<std::string>();
}

// An EBNF string literal: letters, digits, spaces and UTF-8 as they are, every other byte as \xHH.
std::string ebnf_literal(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    if (std::isalnum(c) || c == ' ' || c >= 0x80) {
      out += char(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", unsigned(c));
      out += buf;
    }
  }
  return out + "\"";
}

// vLLM's choice: exactly one of the strings.
std::string choice_ebnf(const json& v, const std::string& field) {
  if (!v.is_array() || v.empty() || v.size() > kMaxChoices)
    throw bad_request(named(field) + " must be a list of 1.." + std::to_string(kMaxChoices) + " strings",
                      field);
  std::string g = "root ::= ";
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || v[i].get<std::string>().empty())
      throw bad_request(named(field) + " must hold non-empty strings", field);
    g += (i ? " | " : "") + ebnf_literal(v[i].get<std::string>());
  }
  return g;
}

GrammarRequest response_format_grammar(const json& rf) {
  if (!rf.is_object()) throw bad_request("'response_format' must be an object", "response_format");
  const json* t = given(rf, "type");
  const std::string type = t && t->is_string() ? t->get<std::string>() : "";
  if (type == "json_object") return {GrammarKind::any_json, "", false, "response_format"};
  if (type == "json_schema") {
    const json* js = given(rf, "json_schema");
    if (!js || !js->is_object())
      throw bad_request("'response_format.json_schema' must be an object with a 'schema'",
                        "response_format.json_schema");
    if (const json* n = given(*js, "name"); n && !n->is_string())
      throw bad_request("'response_format.json_schema.name' must be a string",
                        "response_format.json_schema.name");
    const json* schema = given(*js, "schema");
    if (!schema)
      throw bad_request("'response_format.json_schema.schema' is required",
                        "response_format.json_schema.schema");
    bool strict = false;
    if (const json* s = given(*js, "strict")) {
      if (!s->is_boolean())
        throw bad_request("'response_format.json_schema.strict' must be a boolean",
                          "response_format.json_schema.strict");
      strict = s->get<bool>();
    }
    return {GrammarKind::json_schema, schema_text(*schema, "response_format.json_schema.schema"), strict,
            "response_format"};
  }
  throw bad_request("'response_format' type must be \"text\", \"json_object\" or \"json_schema\"" +
                        (type.empty() ? std::string(" (it has none)") : ", got '" + type + "'"),
                    "response_format");
}

// vLLM's structured_outputs object: one constraint among its keys.
void structured_outputs(const json& so, std::vector<GrammarRequest>& found) {
  if (!so.is_object()) throw bad_request("'structured_outputs' must be an object", "structured_outputs");
  bool closed = false;
  for (const auto& [key, v] : so.items()) {
    if (v.is_null()) continue;
    const std::string f = "structured_outputs." + key;
    if (key == "json")
      found.push_back({GrammarKind::json_schema, schema_text(v, f), false, f});
    else if (key == "regex")
      found.push_back({GrammarKind::regex, text_of(v, f), false, f});
    else if (key == "choice")
      found.push_back({GrammarKind::ebnf, choice_ebnf(v, f), false, f});
    else if (key == "grammar")
      found.push_back({GrammarKind::ebnf, text_of(v, f), false, f});
    else if (key == "json_object") {
      if (!v.is_boolean()) throw bad_request(named(f) + " must be a boolean", f);
      if (v.get<bool>()) found.push_back({GrammarKind::any_json, "", false, f});
    } else if (key == "disable_additional_properties") {
      if (!v.is_boolean()) throw bad_request(named(f) + " must be a boolean", f);
      closed = v.get<bool>();
    } else if (key == "disable_fallback") {  // kiln has one engine: nothing to fall back from
      if (!v.is_boolean()) throw bad_request(named(f) + " must be a boolean", f);
    } else {
      throw bad_request(named(f) +
                            " is not supported (kiln reads json, regex, choice, grammar, json_object, "
                            "disable_additional_properties, disable_fallback)",
                        f);
    }
  }
  if (closed)
    for (GrammarRequest& g : found)
      if (g.field.rfind("structured_outputs.", 0) == 0) g.strict = true;
}

bool strict_tool(const json& t) {
  const json* fn = given(t, "function");
  const json* s = fn && fn->is_object() ? given(*fn, "strict") : nullptr;
  return s && s->is_boolean() && s->get<bool>();
}

}  // namespace

nlohmann::ordered_json structured_output_fields(const nlohmann::json& obj) {
  json out = json::object();
  for (const char* k : {"response_format", "json_schema", "regex", "ebnf", "structured_outputs",
                        "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                        "guided_decoding_backend", "guided_whitespace_pattern", "structural_tag"})
    if (auto it = obj.find(k); it != obj.end()) out[k] = json(*it);
  return out;
}

std::optional<GrammarRequest> parse_structured_output(const json& obj, bool openai_body) {
  std::vector<GrammarRequest> found;
  if (openai_body)
    if (const json* rf = given(obj, "response_format")) {
      const json* t = rf->is_object() ? given(*rf, "type") : nullptr;
      if (!(t && *t == "text")) found.push_back(response_format_grammar(*rf));
    }
  for (const char* name : {"json_schema", "guided_json"})
    if (const json* v = given(obj, name))
      found.push_back({GrammarKind::json_schema, schema_text(*v, name), false, name});
  for (const char* name : {"regex", "guided_regex"})
    if (const json* v = given(obj, name))
      found.push_back({GrammarKind::regex, text_of(*v, name), false, name});
  for (const char* name : {"ebnf", "guided_grammar"})
    if (const json* v = given(obj, name))
      found.push_back({GrammarKind::ebnf, text_of(*v, name), false, name});
  if (const json* v = given(obj, "guided_choice"))
    found.push_back({GrammarKind::ebnf, choice_ebnf(*v, "guided_choice"), false, "guided_choice"});
  if (const json* v = given(obj, "structured_outputs")) structured_outputs(*v, found);
  for (const char* name : {"structural_tag", "guided_whitespace_pattern"})
    if (given(obj, name))
      throw bad_request(named(name) +
                            " is not supported: kiln constrains output with response_format, "
                            "json_schema, regex, ebnf or choice",
                        name);
  if (const json* v = given(obj, "guided_decoding_backend"); v && !v->is_string())
    throw bad_request("'guided_decoding_backend' must be a string", "guided_decoding_backend");
  if (found.size() > 1)
    throw bad_request(named(found[0].field) + " and " + named(found[1].field) +
                          " both constrain the output: give one of them",
                      found[0].field);
  if (found.empty()) return std::nullopt;
  return std::move(found[0]);
}

std::optional<GrammarRequest> tool_call_grammar(const json* tools, const json* tool_choice, bool parallel) {
  if (!tools || !tools->is_array() || tools->empty()) return std::nullopt;
  json spec = {{"tools", json::array()}, {"max_calls", parallel ? 0 : 1}};
  std::string forced;  // a named function
  bool required = false;
  if (tool_choice && tool_choice->is_string()) {
    if (*tool_choice == "none") return std::nullopt;
    required = *tool_choice == "required";
  } else if (tool_choice && tool_choice->is_object()) {
    const json* fn = given(*tool_choice, "function");
    const json* name = fn && fn->is_object() ? given(*fn, "name") : nullptr;
    if (!name || !name->is_string())
      throw bad_request("'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        "tool_choice");
    forced = name->get<std::string>();
    required = true;
  }
  bool all_strict = true, any_strict = false;
  for (const json& t : *tools) {
    const json& fn = t["function"];
    const std::string name = fn["name"].get<std::string>();
    if (!forced.empty() && name != forced) continue;
    const json* params = given(fn, "parameters");
    spec["tools"].push_back({{"name", name}, {"parameters", params ? *params : json::object()}});
    all_strict = all_strict && strict_tool(t);
    any_strict = any_strict || strict_tool(t);
  }
  if (!forced.empty() && spec["tools"].empty())
    throw bad_request("'tool_choice' names the function '" + forced + "', which is not in 'tools'",
                      "tool_choice");
  if (!required && !any_strict) return std::nullopt;  // "auto": the model chooses, unconstrained
  if (!forced.empty()) spec["max_calls"] = 1;
  spec["min_calls"] = required ? 1 : 0;
  spec["free_text"] = !required;
  return GrammarRequest{GrammarKind::tool_calls, spec.dump(), all_strict, "tool_choice"};
}

GrammarRequest with_body_order(GrammarRequest g, const std::string& raw_body, BodyShape shape) {
  try {
    const json body = json::parse(raw_body);
    std::optional<GrammarRequest> again;
    if (g.kind == GrammarKind::tool_calls) {
      const json* p = given(body, "parallel_tool_calls");
      again = tool_call_grammar(given(body, "tools"), given(body, "tool_choice"), !(p && *p == false));
    } else if (shape == BodyShape::responses) {
      const json* t = given(body, "text");
      const json* f = t && t->is_object() ? given(*t, "format") : nullptr;
      const json* schema = f && f->is_object() ? given(*f, "schema") : nullptr;
      if (schema && g.kind == GrammarKind::json_schema) g.text = schema_text(*schema, g.field);
      return g;
    } else {
      const json* obj = shape == BodyShape::generate ? given(body, "sampling_params") : &body;
      if (obj) again = parse_structured_output(*obj, shape == BodyShape::openai);
    }
    if (again && again->kind == g.kind && again->field == g.field) g.text = std::move(again->text);
  } catch (const std::exception&) {  // the body was checked already: keep what was parsed from it
  }
  return g;
}

std::optional<GrammarRequest> chat_grammar(const nlohmann::json& body, const nlohmann::json* tools,
                                           bool tool_call_parser) {
  std::optional<GrammarRequest> format = parse_structured_output(structured_output_fields(body), true);
  const nlohmann::json* tc = given_field(body, "tool_choice");
  const json otools = tools ? json(*tools) : json(), otc = tc ? json(*tc) : json();
  std::optional<GrammarRequest> calls =
      tools ? tool_call_grammar(&otools, &otc, max_tool_calls(body) == 0) : std::nullopt;
  if (calls && !tool_call_parser)
    throw bad_request(
        "'tool_choice' forcing a call needs the server's tool-call parser (--tool-call-parser qwen25)",
        "tool_choice");
  if (format && calls) {
    if (tc)
      throw bad_request(
          "'" + format->field + "' and 'tool_choice' both constrain the output: give one of them",
          format->field);
    return format;  // strict tools under "auto" give way to an explicit format
  }
  return format ? format : calls;
}

int32_t think_end_token(const TextCodec& codec) {
  try {
    const std::vector<int32_t> ids = codec.encode("</think>");
    return ids.size() == 1 ? ids[0] : -1;
  } catch (const kiln::Error&) {
    return -1;
  }
}

GrammarService::GrammarService(const TextCodec& codec, int64_t vocab_size, std::vector<int32_t> eos_ids,
                               GrammarServiceOptions opts)
    : codec_(codec), vocab_size_(vocab_size), eos_ids_(std::move(eos_ids)), opts_(opts) {
  KILN_CHECK(opts_.compile_threads >= 1 && opts_.compile_timeout_ms >= 1,
             "grammar compile threads and timeout must be >= 1");
  for (int i = 0; i < opts_.compile_threads; ++i) threads_.emplace_back([this] { work(); });
}

GrammarService::~GrammarService() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::shared_ptr<const grammar::TokenVocab> GrammarService::vocab() {
  std::call_once(vocab_once_, [&] {
    std::vector<std::string> bytes(static_cast<size_t>(vocab_size_));
    for (int32_t id = 0; id < int32_t(vocab_size_); ++id)
      if (!codec_.is_special(id)) bytes[size_t(id)] = codec_.token_bytes(id);
    vocab_ = grammar::make_vocab(std::move(bytes), eos_ids_);
    cache_ = std::make_unique<grammar::GrammarCache>(vocab_, opts_.cache_entries);
  });
  return vocab_;
}

void GrammarService::work() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lk.unlock();
    job();
    lk.lock();
    --pending_;
  }
}

std::shared_ptr<const grammar::CompiledGrammar> GrammarService::compile(const GrammarRequest& g) {
  struct Outcome {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::shared_ptr<const grammar::CompiledGrammar> grammar;
    std::exception_ptr error;
  };
  auto out = std::make_shared<Outcome>();
  grammar::CompileOptions o;
  o.lenient = opts_.lenient;
  o.strict = g.strict;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (pending_ >= opts_.max_pending)
      throw ApiError(503,
                     "the grammar compile queue is full (" + std::to_string(opts_.max_pending) +
                         " grammars compiling); retry later",
                     g.field, "", "service_unavailable");
    ++pending_;
    // The job owns copies of what it reads: a request that stopped waiting may be gone when it runs.
    jobs_.push_back([this, out, g, o] {
      try {
        vocab();
        auto cg = cache_->get(g.kind, g.text, o);
        std::lock_guard<std::mutex> l(out->mu);
        out->grammar = std::move(cg);
      } catch (...) {
        std::lock_guard<std::mutex> l(out->mu);
        out->error = std::current_exception();
      }
      std::lock_guard<std::mutex> l(out->mu);
      out->done = true;
      out->cv.notify_all();
    });
  }
  cv_.notify_one();
  std::unique_lock<std::mutex> lk(out->mu);
  if (!out->cv.wait_for(lk, std::chrono::milliseconds(opts_.compile_timeout_ms), [&] { return out->done; }))
    throw bad_request(named(g.field) + ": compiling the grammar took longer than the limit of " +
                          std::to_string(opts_.compile_timeout_ms) + " ms (--grammar-compile-timeout-ms)",
                      g.field);
  if (!out->error) return out->grammar;
  try {
    std::rethrow_exception(out->error);
  } catch (const grammar::UnsupportedKeyword& e) {
    throw bad_request(
        named(g.field) + ": the JSON Schema keyword '" + e.keyword() +
            "' cannot be enforced by kiln's grammar engine (the server's --grammar-lenient drops "
            "such keywords)",
        g.field);
  } catch (const std::exception& e) {
    throw bad_request(named(g.field) + ": the grammar could not be compiled: " + e.what(), g.field);
  }
}

size_t GrammarService::cached() const {
  return cache_ ? cache_->size() : 0;
}

}  // namespace kiln::server
