// Fuzzes the JSON Schema front end (and the regex parser through `pattern`): any text either compiles into a
// grammar whose matcher gives a non-empty mask at the start, or is a kiln::Error (UnsupportedKeyword
// included). grammar_fuzz.h.
#include "grammar_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz_grammar(kiln::grammar::GrammarKind::json_schema, data, size);
}
