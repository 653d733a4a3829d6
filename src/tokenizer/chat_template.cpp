// Chat-template discovery, the variables transformers passes, and dispatch to the native Qwen3 renderer or
// the Jinja interpreter; see chat_template.h.
#include "tokenizer/chat_template.h"

#include "kiln/error.h"
#include "kiln/json_depth.h"

namespace kiln::tok {
namespace {

using ojson = nlohmann::ordered_json;

ojson parse_json(std::string_view text, const char* what) {
  check_json_depth(text, what);  // the values are converted and dumped recursively
  try {
    return ojson::parse(text);
  } catch (const ojson::exception& e) {
    KILN_FAIL(what, " is not valid JSON: ", e.what());
  }
}

// The token's text: a plain string or an AddedToken object {"content": ...}.
ojson token_text(const ojson& v) {
  if (v.is_string()) return v;
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content");
  return nullptr;
}

}  // namespace

std::shared_ptr<const ChatTemplate> ChatTemplate::load(std::string_view tokenizer_config_json,
                                                       std::string_view chat_template_jinja,
                                                       std::string_view chat_template_json) {
  auto ct = std::make_shared<ChatTemplate>();
  const ojson cfg = tokenizer_config_json.empty()
                        ? ojson::object()
                        : parse_json(tokenizer_config_json, "tokenizer_config.json");
  if (cfg.is_object()) {
    for (const char* k :
         {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"})
      if (auto it = cfg.find(k); it != cfg.end())
        if (ojson t = token_text(*it); !t.is_null()) ct->special_tokens_[k] = t;
    if (auto it = cfg.find("additional_special_tokens"); it != cfg.end() && it->is_array()) {
      ojson list = ojson::array();
      for (const auto& t : *it)
        if (ojson s = token_text(t); !s.is_null()) list.push_back(s);
      ct->special_tokens_["additional_special_tokens"] = list;
    }
  }
  ojson spec;  // a string, or a list of {"name", "template"}
  if (!chat_template_jinja.empty()) {
    spec = std::string(chat_template_jinja);
    ct->origin_ = "chat_template.jinja";
  } else if (!chat_template_json.empty()) {
    const ojson j = parse_json(chat_template_json, "chat_template.json");
    if (j.is_object() && j.contains("chat_template")) spec = j.at("chat_template");
    ct->origin_ = "chat_template.json";
  } else if (cfg.is_object() && cfg.contains("chat_template")) {
    spec = cfg.at("chat_template");
    ct->origin_ = "tokenizer_config.json";
  }
  auto add = [&](std::string name, std::string source) {
    Entry e;
    e.name = std::move(name);
    e.source = std::move(source);
    e.native_qwen3 = is_qwen3_template(e.source);
    try {
      e.compiled = std::make_shared<const tmpl::Template>(e.source);
    } catch (const tmpl::TemplateError& err) {
      e.parse_error = err.what();
    }
    ct->entries_.push_back(std::move(e));
  };
  if (spec.is_string()) {
    add("default", spec.get<std::string>());
  } else if (spec.is_array()) {
    for (const auto& t : spec)
      if (t.is_object() && t.value("name", ojson()).is_string() && t.value("template", ojson()).is_string())
        add(t.at("name").get<std::string>(), t.at("template").get<std::string>());
  } else if (spec.is_object()) {  // {name: template}, as transformers saves a dict
    for (const auto& [k, v] : spec.items())
      if (v.is_string()) add(k, v.get<std::string>());
  }
  return ct;
}

std::string ChatTemplate::describe() const {
  if (entries_.empty()) return "none";
  std::string s;
  for (const auto& e : entries_) {
    if (!s.empty()) s += "; ";
    s += "'" + e.name + "' from " + origin_ + ": ";
    s += e.native_qwen3 ? "Qwen3, rendered natively"
         : e.compiled   ? "Jinja, interpreted"
                        : "does not parse: " + e.parse_error;
  }
  return s;
}

const ChatTemplate::Entry& ChatTemplate::pick(const ojson& request) const {
  KILN_CHECK(!entries_.empty(), "this checkpoint has no chat template");
  if (entries_.size() == 1) return entries_[0];
  const bool tools = request.contains("tools") && !request.at("tools").is_null();
  for (const char* want : {tools ? "tool_use" : "", "default"})
    for (const auto& e : entries_)
      if (e.name == want) return e;
  KILN_FAIL("this checkpoint has several chat templates and none is named \"default\"");
}

std::string ChatTemplate::render(std::string_view request_json, bool allow_native) const {
  KILN_CHECK(!entries_.empty(),
             "this tokenizer has no chat template (tokenizer_config.json, chat_template.jinja "
             "or chat_template.json)");
  // The native path parses the request itself (and rejects what it cannot render) when it applies.
  if (allow_native && entries_.size() == 1 && entries_[0].native_qwen3)
    return render_qwen3_chat(request_json);
  const ojson req = parse_json(request_json, "chat request");
  KILN_CHECK(req.is_object(), "chat request must be a JSON object");
  KILN_CHECK(req.contains("messages") && req.at("messages").is_array(),
             "chat request needs a \"messages\" list");
  const Entry& e = pick(req);
  if (allow_native && e.native_qwen3) return render_qwen3_chat(request_json);
  if (!e.compiled) KILN_FAIL("the chat template does not parse: ", e.parse_error);
  // transformers: render(messages=..., tools=..., documents=..., add_generation_prompt=...,
  // **{**special_tokens_map, **kwargs}).
  tmpl::Value vars = tmpl::Value::object();
  auto& items = vars.o->items;
  items.emplace_back("messages", tmpl::from_json(req.at("messages")));
  items.emplace_back("tools", tmpl::Value::none());
  items.emplace_back("documents", tmpl::Value::none());
  items.emplace_back("add_generation_prompt", tmpl::Value::boolean(false));
  for (const auto& [k, v] : special_tokens_.items()) items.emplace_back(k, tmpl::from_json(v));
  for (const auto& [k, v] : req.items())
    if (k != "messages") vars.o->set(k, tmpl::from_json(v));
  return e.compiled->render(vars);
}

std::string ChatTemplate::render(std::string_view request_json) const {
  return render(request_json, true);
}

std::string ChatTemplate::render_interpreted(std::string_view request_json) const {
  return render(request_json, false);
}

}  // namespace kiln::tok
