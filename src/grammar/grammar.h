// The grammar IR: a context-free grammar whose terminals are byte-level DFAs ("lexemes"). Every front end
// (JSON Schema, regex, EBNF, any-JSON) builds one with GrammarBuilder; normalize() checks and flattens it
// for the matcher.
//
// A rule is a list of alternatives; an alternative is a sequence of elements, each a lexeme (a DFA matched
// byte by byte) or a call of a rule. Regular pieces should be one lexeme rather than many rules: the mask
// cache works per (lexeme position, DFA state), and a lexeme keeps the walk inside one table.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/fsm.h"
#include "grammar/regex.h"

namespace kiln::grammar {

struct Element {
  enum class Kind : uint8_t { lexeme, rule };
  Kind kind;
  uint32_t id;
};

struct Rule {
  std::string name;
  std::vector<std::vector<Element>> alts;
};

struct Grammar {
  std::vector<Rule> rules;
  std::vector<Dfa> lexemes;
  uint32_t root = 0;
};

class GrammarBuilder {
 public:
  static constexpr size_t kMaxElements = 1000000;  // grammar size limit (rules + elements)
  uint32_t new_rule(std::string name);
  void add_alt(uint32_t rule, std::vector<Element> seq);
  Element lexeme(Dfa d);  // deduplicated by content
  Element lexeme(const Re& r, bool json_escape = false);
  Element literal(std::string_view bytes);
  Element call(uint32_t rule) const { return {Element::Kind::rule, rule}; }
  Rule& rule(uint32_t id) { return g_.rules[id]; }
  size_t num_rules() const { return g_.rules.size(); }
  Grammar finish(uint32_t root);

 private:
  Grammar g_;
  size_t elements_ = 0;
};

// A position in the flattened grammar: one element of one alternative, or the end of the alternative.
struct Position {
  enum class Kind : uint8_t { end, lexeme, call };
  Kind kind;
  uint32_t id;        // lexeme or rule
  uint32_t rule;      // the rule this position belongs to
  bool tail = false;  // a call followed by the end of its alternative (a tail call: no frame is pushed)
};

struct FlatGrammar {
  std::vector<Position> pos;
  std::vector<std::vector<uint32_t>> alt_starts;  // per rule: the first position of each alternative
  std::vector<Dfa> lexemes;
  std::vector<std::string> rule_names;
  std::vector<std::array<uint64_t, 4>> follow;  // per rule: the bytes that may come right after it ends
  std::vector<uint32_t> key_base;               // per position: first mask-cache key of a lexeme position
  uint32_t num_keys = 0;
  uint32_t root = 0;
};

// Drops alternatives that can never complete, refuses a root that can never complete ("grammar can never
// finish") and left recursion (named), then flattens. Throws kiln::Error.
FlatGrammar normalize(Grammar g);

}  // namespace kiln::grammar
