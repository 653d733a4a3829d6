// The Qwen3 chat template, rendered natively: the fast path for the one template most kiln checkpoints
// carry (recognised by a fingerprint of its exact text; chat_template.cpp sends every other template to the
// Jinja interpreter in src/template). It renders ~10x faster than the interpreter and keeps kiln's
// documented extensions below; tests check it against Jinja2 goldens and against the interpreter.
//
// Deviations from Jinja, where Jinja would raise or print a Python repr (never where it renders text):
// missing/null "content" renders as ""; "content" given as a list of {"type": "text", "text": ...} parts
// renders their concatenation (other part types are rejected); a message without a string "role" is
// rejected (Jinja would skip it silently).
#include <nlohmann/json.hpp>

#include "kiln/error.h"
#include "kiln/json_depth.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/pyjson.h"

namespace kiln {
namespace {

using ojson = nlohmann::ordered_json;

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// Fingerprints of the templates this file implements (FNV-1a 64 of the exact text).
// Qwen3 (0.6B ... 235B-A22B, April 2025): thinking with <think> around the last query, tools,
// enable_thinking.
constexpr uint64_t kQwen3Template = 0x2bfdb7aa9754484eull;

bool truthy(const ojson& v) {  // Python truthiness of a JSON value
  switch (v.type()) {
    case ojson::value_t::null:
      return false;
    case ojson::value_t::boolean:
      return v.get<bool>();
    case ojson::value_t::number_integer:
      return v.get<int64_t>() != 0;
    case ojson::value_t::number_unsigned:
      return v.get<uint64_t>() != 0;
    case ojson::value_t::number_float:
      return v.get<double>() != 0.0;
    case ojson::value_t::string:
      return !v.get_ref<const std::string&>().empty();
    case ojson::value_t::array:
    case ojson::value_t::object:
      return !v.empty();
    default:
      return false;
  }
}

struct Message {
  std::string role, content;
  const ojson* raw;
};

std::string content_of(const ojson& m, size_t i) {
  if (!m.contains("content") || m.at("content").is_null()) return "";
  const ojson& c = m.at("content");
  if (c.is_string()) return c.get<std::string>();
  KILN_CHECK(c.is_array(), "messages[", i, "].content must be a string, null or a list of text parts");
  std::string s;
  for (const auto& part : c) {
    KILN_CHECK(part.is_object() && part.value("type", "") == "text" && part.contains("text") &&
                   part.at("text").is_string(),
               "messages[", i, "].content: only {\"type\": \"text\", \"text\": ...} parts are supported");
    s += part.at("text").get<std::string>();
  }
  return s;
}

std::string lstrip_nl(std::string_view s) {
  size_t b = 0;
  while (b < s.size() && s[b] == '\n') ++b;
  return std::string(s.substr(b));
}
std::string rstrip_nl(std::string_view s) {
  size_t e = s.size();
  while (e > 0 && s[e - 1] == '\n') --e;
  return std::string(s.substr(0, e));
}
std::string strip_nl(std::string_view s) {
  return lstrip_nl(rstrip_nl(s));
}
bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

void render_tool_calls(const ojson& calls, const std::string& content, size_t i, std::string& out) {
  KILN_CHECK(calls.is_array(), "messages[", i, "].tool_calls must be a list");
  for (size_t j = 0; j < calls.size(); ++j) {
    if ((j == 0 && !content.empty()) || j > 0) out += '\n';
    const ojson* tc = &calls[j];
    KILN_CHECK(tc->is_object(), "messages[", i, "].tool_calls[", j, "] must be an object");
    if (tc->contains("function") && truthy(tc->at("function"))) tc = &tc->at("function");
    KILN_CHECK(tc->is_object(), "messages[", i, "].tool_calls[", j, "].function must be an object");
    out += "<tool_call>\n{\"name\": \"";
    if (tc->contains("name") && !tc->at("name").is_null()) {
      KILN_CHECK(tc->at("name").is_string(), "messages[", i, "].tool_calls[", j, "]: name must be a string");
      out += tc->at("name").get<std::string>();
    }
    out += "\", \"arguments\": ";
    KILN_CHECK(tc->contains("arguments"), "messages[", i, "].tool_calls[", j, "]: arguments are missing");
    const ojson& args = tc->at("arguments");
    if (args.is_string()) {
      out += args.get<std::string>();
    } else {
      tok::py_json_dumps(args, out);
    }
    out += "}\n</tool_call>";
  }
}

std::string render_qwen3(const ojson& req) {
  KILN_CHECK(req.is_object(), "chat request must be a JSON object");
  KILN_CHECK(req.contains("messages") && req.at("messages").is_array(),
             "chat request needs a \"messages\" list");
  const ojson& raw = req.at("messages");
  std::vector<Message> msgs;
  for (size_t i = 0; i < raw.size(); ++i) {
    const ojson& m = raw[i];
    KILN_CHECK(m.is_object(), "messages[", i, "] must be an object");
    KILN_CHECK(m.contains("role") && m.at("role").is_string(), "messages[", i, "].role must be a string");
    msgs.push_back({m.at("role").get<std::string>(), content_of(m, i), &m});
  }
  const ojson tools = req.value("tools", ojson());
  KILN_CHECK(tools.is_null() || tools.is_array(), "\"tools\" must be a list");
  const bool agp = truthy(req.value("add_generation_prompt", ojson()));
  const bool thinking_off = req.contains("enable_thinking") && req.at("enable_thinking").is_boolean() &&
                            !req.at("enable_thinking").get<bool>();

  std::string out;
  const size_t n = msgs.size();
  const bool first_system = n > 0 && msgs[0].role == "system";
  if (truthy(tools)) {
    out += "<|im_start|>system\n";
    if (first_system) out += msgs[0].content + "\n\n";
    out +=
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
        "with "
        "function signatures within <tools></tools> XML tags:\n<tools>";
    for (const auto& t : tools) {
      out += '\n';
      tok::py_json_dumps(t, out);
    }
    out +=
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n";
  } else if (first_system) {
    out += "<|im_start|>system\n" + msgs[0].content + "<|im_end|>\n";
  }

  // The last user turn that is a real query (not a wrapped tool response).
  long last_query = long(n) - 1;
  for (long i = long(n) - 1; i >= 0; --i) {
    const Message& m = msgs[size_t(i)];
    if (m.role == "user" &&
        !(starts_with(m.content, "<tool_response>") && ends_with(m.content, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }

  for (size_t i = 0; i < n; ++i) {
    const Message& m = msgs[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string content = m.content, reasoning;
      const ojson& rc = m.raw->value("reasoning_content", ojson());
      if (!rc.is_null()) {
        KILN_CHECK(rc.is_string(), "messages[", i, "].reasoning_content must be a string");
        reasoning = rc.get<std::string>();
      } else if (content.find("</think>") != std::string::npos) {
        const std::string& c = m.content;
        content = lstrip_nl(std::string_view(c).substr(c.rfind("</think>") + 8));
        const std::string before = rstrip_nl(std::string_view(c).substr(0, c.find("</think>")));
        const size_t t = before.rfind("<think>");
        reasoning = lstrip_nl(t == std::string::npos ? before : before.substr(t + 7));
      }
      if (long(i) > last_query && (i + 1 == n || !reasoning.empty())) {
        out +=
            "<|im_start|>assistant\n<think>\n" + strip_nl(reasoning) + "\n</think>\n\n" + lstrip_nl(content);
      } else {
        out += "<|im_start|>assistant\n" + content;
      }
      const ojson& calls = m.raw->value("tool_calls", ojson());
      if (truthy(calls)) render_tool_calls(calls, content, i, out);
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == n || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
    }
    // Any other role renders nothing, as in the template.
  }
  if (agp) {
    out += "<|im_start|>assistant\n";
    if (thinking_off) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace

namespace tok {

bool is_qwen3_template(std::string_view chat_template) {
  return fnv1a(chat_template) == kQwen3Template;
}

std::string render_qwen3_chat(std::string_view request_json) {
  check_json_depth(request_json, "chat request");  // render_qwen3 dumps tool schemas recursively
  ojson req;
  try {
    req = ojson::parse(request_json);
  } catch (const ojson::exception& e) {
    KILN_FAIL("chat request is not valid JSON: ", e.what());
  }
  try {
    return render_qwen3(req);
  } catch (const ojson::exception& e) {
    KILN_FAIL("chat request has an unexpected structure: ", e.what());
  }
}

}  // namespace tok
}  // namespace kiln
