#include "tokenizer/post_processor.h"

#include <string>

#include "kiln/error.h"

namespace kiln::tok {

namespace {

using json = nlohmann::json;

int32_t checked_id(const json& v, int64_t vocab_size, const std::string& where) {
  KILN_CHECK(v.is_number_integer(), "tokenizer.json: ", where, " must be a token id, got ", v.dump());
  const int64_t id = v.get<int64_t>();
  KILN_CHECK(id >= 0 && id < vocab_size, "tokenizer.json: ", where, " holds token id ", id,
             ", outside the vocabulary [0, ", vocab_size, ")");
  return int32_t(id);
}

// ["[SEP]", 102] (Bert/Roberta's sep and cls): the id.
int32_t pair_id(const json& p, const char* key, int64_t vocab_size, const std::string& where) {
  const json* v = p.contains(key) ? &p.at(key) : nullptr;
  KILN_CHECK(v && v->is_array() && v->size() == 2, "tokenizer.json: ", where, ".", key,
             " must be [token, id]");
  return checked_id((*v)[1], vocab_size, where + "." + key);
}

}  // namespace

void PostProcessor::parse_into(const json& j, int64_t vocab_size, const std::string& where,
                               std::vector<Template>& out) {
  if (j.is_null()) return;
  KILN_CHECK(j.is_object() && j.contains("type") && j.at("type").is_string(), "tokenizer.json: ", where,
             " must be an object with a \"type\"");
  const std::string type = j.at("type").get<std::string>();
  if (type == "ByteLevel") return;  // trims offsets; the ids are unchanged
  if (type == "Sequence") {
    const json& ps = j.value("processors", json());
    KILN_CHECK(ps.is_array(), "tokenizer.json: ", where, ".processors must be a list");
    for (size_t i = 0; i < ps.size(); ++i)
      parse_into(ps[i], vocab_size, where + ".processors[" + std::to_string(i) + "]", out);
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    Piece cls{-1, {pair_id(j, "cls", vocab_size, where)}}, sep{-1, {pair_id(j, "sep", vocab_size, where)}};
    const Piece a{0, {}}, b{1, {}};
    Template t;
    t.single = {cls, a, sep};
    t.pair = type == "BertProcessing" ? std::vector<Piece>{cls, a, sep, b, sep}
                                      : std::vector<Piece>{cls, a, sep, sep, b, sep};
    out.push_back(std::move(t));
    return;
  }
  KILN_CHECK(
      type == "TemplateProcessing", "tokenizer.json: ", where, " type \"", type,
      "\" is not supported (TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence)");
  const json& specials = j.value("special_tokens", json::object());
  KILN_CHECK(specials.is_object(), "tokenizer.json: ", where, ".special_tokens must be an object");
  auto pieces = [&](const char* key, bool pair) {
    const json& list = j.value(key, json());
    KILN_CHECK(list.is_array(), "tokenizer.json: ", where, ".", key, " must be a list");
    std::vector<Piece> ps;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string at = where + "." + key + "[" + std::to_string(i) + "]";
      const json& e = list[i];
      if (e.is_object() && e.contains("Sequence")) {
        const std::string id = e.at("Sequence").value("id", "");
        KILN_CHECK(id == "A" || (pair && id == "B"), "tokenizer.json: ", at, " names sequence \"", id, "\" (",
                   pair ? "A or B" : "A", ")");
        ps.push_back({id == "A" ? 0 : 1, {}});
      } else if (e.is_object() && e.contains("SpecialToken")) {
        const std::string name = e.at("SpecialToken").value("id", "");
        KILN_CHECK(specials.contains(name), "tokenizer.json: ", at, " names special token \"", name,
                   "\", which special_tokens does not define");
        const json& ids = specials.at(name).value("ids", json());
        KILN_CHECK(ids.is_array() && !ids.empty(), "tokenizer.json: ", where, ".special_tokens[\"", name,
                   "\"].ids must be a non-empty list");
        Piece p;
        for (const json& id : ids) p.ids.push_back(checked_id(id, vocab_size, at));
        ps.push_back(std::move(p));
      } else {
        KILN_FAIL("tokenizer.json: ", at, " must be {\"Sequence\": ...} or {\"SpecialToken\": ...}, got ",
                  e.dump());
      }
    }
    return ps;
  };
  Template t;
  t.single = pieces("single", false);
  t.pair = pieces("pair", true);
  out.push_back(std::move(t));
}

PostProcessor PostProcessor::parse(const json& j, int64_t vocab_size) {
  PostProcessor p;
  parse_into(j, vocab_size, "post_processor", p.steps_);
  return p;
}

std::vector<int32_t> PostProcessor::apply(const std::vector<int32_t>& a, const std::vector<int32_t>* b,
                                          bool add_special_tokens) const {
  std::vector<int32_t> first = a, second;
  bool has_second = b != nullptr;
  if (b) second = *b;
  if (add_special_tokens) {
    // Each template merges its sequences into one, which the next step sees as A.
    for (const Template& t : steps_) {
      std::vector<int32_t> merged;
      for (const Piece& p : has_second ? t.pair : t.single) {
        const std::vector<int32_t>& src = p.sequence == 0 ? first : p.sequence == 1 ? second : p.ids;
        merged.insert(merged.end(), src.begin(), src.end());
      }
      first = std::move(merged);
      second.clear();
      has_second = false;
    }
  }
  first.insert(first.end(), second.begin(), second.end());
  return first;
}

bool PostProcessor::adds_tokens() const {
  for (const Template& t : steps_)
    for (const Piece& p : t.single)
      if (p.sequence < 0 && !p.ids.empty()) return true;
  return false;
}

}  // namespace kiln::tok
