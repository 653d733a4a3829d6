// UTF-8 and Unicode helpers for the tokenizer: validation, lossy decoding (U+FFFD per maximal invalid
// subsequence, as Rust's String::from_utf8_lossy and Python's errors="replace" do), NFC, character classes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::tok {

// Byte offset of the first invalid UTF-8 sequence in s (overlongs, surrogates, > U+10FFFF and truncated
// sequences are invalid), or std::string_view::npos when s is valid.
size_t utf8_find_invalid(std::string_view s);

// Appends s to out with each maximal invalid subsequence replaced by U+FFFD. With final=false a trailing
// incomplete-but-valid-so-far sequence is left unconsumed. Returns the number of bytes of s consumed.
size_t utf8_lossy_append(std::string_view s, std::string& out, bool final);

// Decodes the code point at s[i] (s must be valid UTF-8); advances i.
uint32_t utf8_next(std::string_view s, size_t& i);
// Decodes the code point that ends at s[end) (s valid UTF-8).
uint32_t utf8_prev(std::string_view s, size_t end);
void utf8_append(uint32_t cp, std::string& out);

// NFC of valid UTF-8 s, appended to out. Runs that cannot change under NFC (code points below U+0300 and
// other starters that never compose with what precedes them) are copied; only the rest goes to utf8proc.
void nfc_append(std::string_view s, std::string& out);

bool is_white_space(uint32_t cp);  // the Unicode White_Space property (Rust/Oniguruma \s)
bool is_word_char(uint32_t cp);    // Rust regex \w: letters, marks, Nd, Nl, Pc, ZWJ/ZWNJ

}  // namespace kiln::tok
