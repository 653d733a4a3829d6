#!/usr/bin/env python3
"""Golden ids from Hugging Face `tokenizers` (the reference that wins disagreements), for
tests/fixtures/tokenizer/strings.json, plus: decode goldens (lossy UTF-8 on id prefixes that split characters),
added-token flag goldens (lstrip/rstrip/single_word/normalized/special on tokens added to the real tokenizer),
and a cross-check of the Jinja2 chat goldens against transformers' apply_chat_template.

Runs on the device machine (python3 there has tokenizers + transformers), one call:
  python3 scripts/tokenizer_goldens.py MODEL_DIR OUT.json
then copy OUT.json to tests/fixtures/tokenizer/goldens_hf.json.
"""
import json
import os
import sys
import time

from tokenizers import AddedToken, Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests/fixtures/tokenizer")

# Added tokens with every flag, appended to the real tokenizer; strings that exercise each.
FLAG_TOKENS = [
    dict(content="[LS]", lstrip=True, normalized=False, special=False),
    dict(content="[RS]", rstrip=True, normalized=False, special=False),
    dict(content="kilnword", single_word=True, normalized=False, special=False),
    dict(content="A\u030aX", normalized=True, special=False),     # matched after NFC (pattern becomes "ÅX")
    dict(content="[SP]", lstrip=True, rstrip=True, normalized=False, special=True),
    dict(content="[SW]", single_word=True, lstrip=True, normalized=False, special=True),
]
FLAG_STRINGS = [
    "a [LS] b", "a    [LS]", "\t\n[LS]x", "[LS][LS]", "x[RS]   y", "[RS]\n\n", "[RS] [LS]", "kilnword",
    "a kilnword b", "akilnword", "kilnwordz", "kilnword_x", "(kilnword)", "é kilnword", "kilnword1", "1kilnword",
    "A\u030aX", "\u00c5X", "\u212bX", "zA\u030aXz", "  [SP]  ", "a[SP]b", "x [SW] y", "x[SW] y", "[SW]", "日本[SW]",
    "kilnword kilnword", "[LS]<|im_end|>[RS]", "<|im_end|> [SP] <|endoftext|>", "",
]


def main():
    model_dir, out_path = sys.argv[1], sys.argv[2]
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(FIX, "strings.json"), encoding="utf-8") as f:
        strings = json.load(f)
    goldens = []
    for s in strings:
        ids = tok.encode(s["text"], add_special_tokens=False).ids
        goldens.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                        "decoded_skip": tok.decode(ids, skip_special_tokens=True)})

    # Decode of every prefix of short id lists: exercises lossy replacement of split characters.
    decode_cases = []
    for g in goldens:
        if 1 < len(g["ids"]) <= 40 and any(ord(c) > 127 for c in g["decoded"]):
            for k in range(1, len(g["ids"])):
                ids = g["ids"][:k]
                decode_cases.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                                     "text_skip": tok.decode(ids, skip_special_tokens=True)})

    flag_tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    for t in FLAG_TOKENS:
        at = AddedToken(t["content"], single_word=t.get("single_word", False), lstrip=t.get("lstrip", False),
                        rstrip=t.get("rstrip", False), normalized=t["normalized"], special=t["special"])
        (flag_tok.add_special_tokens if t["special"] else flag_tok.add_tokens)([at])
    flag_added = json.loads(flag_tok.to_str())["added_tokens"]
    flags = []
    for s in FLAG_STRINGS:
        ids = flag_tok.encode(s, add_special_tokens=False).ids
        flags.append({"text": s, "ids": ids, "decoded": flag_tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip": flag_tok.decode(ids, skip_special_tokens=True)})

    # Chat template cross-check: transformers' own apply_chat_template on the Jinja2 goldens' requests.
    chat = {"error": None, "rendered": []}
    try:
        import transformers
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(model_dir)
        chat["transformers"] = transformers.__version__
        with open(os.path.join(FIX, "chat_goldens.json"), encoding="utf-8") as f:
            cases = json.load(f)["cases"]
        for c in cases:
            r = dict(c["request"])
            msgs, tools = r.pop("messages"), r.pop("tools", None)
            agp = r.pop("add_generation_prompt", False)
            try:
                chat["rendered"].append(hf.apply_chat_template(msgs, tools=tools, add_generation_prompt=agp,
                                                               tokenize=False, **r))
            except Exception as e:  # noqa: BLE001 - recorded, compared in the test
                chat["rendered"].append({"error": repr(e)})
    except Exception as e:  # noqa: BLE001
        chat["error"] = repr(e)

    # Informational: HF single-thread encode speed on this (device) host over the golden strings.
    os.environ["RAYON_NUM_THREADS"] = "1"
    text = "".join(s["text"] for s in strings)
    t0 = time.perf_counter()
    tok.encode(text, add_special_tokens=False)
    dt = time.perf_counter() - t0

    import tokenizers
    out = {"reference": f"tokenizers {tokenizers.__version__}", "goldens": goldens, "decode_cases": decode_cases,
           "flag_added_tokens": flag_added, "flag_cases": flags, "chat": chat,
           "hf_encode_info": {"bytes": len(text.encode()), "seconds": dt}}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
        f.write("\n")
    print(f"goldens={len(goldens)} decode_cases={len(decode_cases)} flag_cases={len(flags)} "
          f"chat={len(chat['rendered'])} chat_error={chat['error']} -> {out_path}")


if __name__ == "__main__":
    main()
