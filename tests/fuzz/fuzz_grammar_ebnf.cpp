// Fuzzes the EBNF front end (GBNF / XGrammar syntax; its classes go through the regex parser): any text
// either compiles into a grammar whose matcher gives a non-empty mask at the start, or is a kiln::Error.
// grammar_fuzz.h.
#include "grammar_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return fuzz_grammar(kiln::grammar::GrammarKind::ebnf, data, size);
}
