#!/usr/bin/env python3
"""Builds the tokenizer throughput corpora from text already on a Debian machine (no download):
  OUT/mixed.txt    >= 1 MB of mixed-language text: the translated messages (msgstr) of the gettext catalogues
                   under /usr/share/locale for 16 languages (CJK, Cyrillic, Arabic, Hebrew, Indic, Thai, Greek,
                   Latin scripts), interleaved in 4 KB blocks, plus English license prose.
  OUT/english.txt  English prose: /usr/share/common-licenses/*, repeated to >= 1 MB.
Prints each file's size and sha256 so a PERF.md line can be reproduced.
Usage: python3 scripts/tokenizer_bench_corpus.py OUT_DIR
"""
import glob
import gettext
import hashlib
import os
import sys

LANGS = ["zh_CN", "ja", "ko", "ru", "ar", "he", "hi", "th", "el", "de", "fr", "es", "vi", "uk", "tr", "pl"]
TARGET = 1_200_000


def catalog_text(lang):
    parts = []
    for mo in sorted(glob.glob(f"/usr/share/locale/{lang}/LC_MESSAGES/*.mo")):
        try:
            with open(mo, "rb") as f:
                cat = gettext.GNUTranslations(f)
        except Exception:  # noqa: BLE001 - a malformed catalogue is skipped
            continue
        for k, v in sorted(cat._catalog.items(), key=lambda kv: str(kv[0])):
            if isinstance(v, str) and v.strip() and k:
                parts.append(v)
    return "\n".join(parts)


def english():
    texts = []
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(p):
            with open(p, encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
    return "\n\n".join(texts)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    eng = english()
    per_lang = {l: catalog_text(l) for l in LANGS}
    blocks, i = [], 0
    total = 0
    while total < TARGET:
        for l in LANGS + ["en"]:
            src = eng if l == "en" else per_lang[l]
            if not src:
                continue
            start = (i * 4096) % max(1, len(src) - 4096)
            b = src[start:start + 4096]
            blocks.append(b)
            total += len(b.encode())
        i += 1
    mixed = "\n".join(blocks)
    english_text = eng
    while len(english_text.encode()) < TARGET:
        english_text += "\n\n" + eng
    for name, text in (("mixed.txt", mixed), ("english.txt", english_text)):
        data = text.encode()
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes sha256 {hashlib.sha256(data).hexdigest()[:16]}")
    print("languages with text:", [l for l in LANGS if per_lang[l]])


if __name__ == "__main__":
    main()
