// kiln grammar check: whether a grammar accepts candidate outputs, walking the model's tokenization of each.
//   grammar check --model DIR (--json-schema FILE | --regex R | --ebnf FILE | --any-json) [--lenient]
//                 [--strict]
// stdin: one JSON string per line (the candidate text); stdout: `accept` or `reject` per line. A schema
// keyword the engine cannot enforce prints `unsupported: KEYWORD` and exits 3.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli/command.h"
#include "cli/flags.h"
#include "cli/grammar_vocab.h"
#include "kiln/error.h"
#include "kiln/grammar.h"
#include "kiln/tokenizer.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f.good(), "cannot read ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int run_grammar_check(const kiln::cli::Args& args) {
  using namespace kiln::grammar;
  const kiln::cli::Flags f(args, {"model", "json-schema", "regex", "ebnf"},
                           {"lenient", "strict", "any-json"});
  const int sources =
      int(f.has("json-schema")) + int(f.has("regex")) + int(f.has("ebnf")) + int(f.flag("any-json"));
  KILN_CHECK(sources == 1,
             "grammar check: give exactly one of --json-schema FILE, --regex R, --ebnf FILE, --any-json");
  const auto tk = kiln::Tokenizer::load(f.required("model"));
  CompileOptions o;
  o.lenient = f.flag("lenient");
  o.strict = f.flag("strict");
  std::shared_ptr<const CompiledGrammar> g;
  try {
    const auto vocab = kiln::cli::grammar_vocab(tk);
    if (f.has("json-schema"))
      g = compile(GrammarKind::json_schema, read_file(f.str("json-schema")), vocab, o);
    else if (f.has("regex"))
      g = compile(GrammarKind::regex, f.str("regex"), vocab, o);
    else if (f.has("ebnf"))
      g = compile(GrammarKind::ebnf, read_file(f.str("ebnf")), vocab, o);
    else
      g = compile(GrammarKind::any_json, "", vocab, o);
  } catch (const UnsupportedKeyword& e) {
    std::cout << "unsupported: " << e.keyword() << "\n";
    return 3;
  }
  const std::vector<int32_t> eos = tk.eos_token_ids();
  std::string line;
  size_t n = 0;
  while (std::getline(std::cin, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      KILN_FAIL("grammar check: line ", n, " is not a JSON string: ", e.what());
    }
    KILN_CHECK(j.is_string(), "grammar check: line ", n, " is not a JSON string");
    Matcher m(g);
    bool ok = true;
    for (int32_t id : tk.encode(j.get<std::string>()))
      if (!(ok = m.accept_token(id))) break;
    ok = ok && m.is_complete() && !eos.empty() && m.accept_token(eos[0]);
    std::cout << (ok ? "accept" : "reject") << "\n";
  }
  std::cout.flush();
  return 0;
}

}  // namespace

KILN_COMMAND("grammar check",
             "accept/reject per stdin line (JSON strings) under --json-schema/--regex/--ebnf/--any-json",
             run_grammar_check);
