"""JSON/SSE assertions for test_curl.sh: `python3 check.py CHECK FILE [ARGS...]`; exits 1 with a reason."""
import json
import sys


def die(msg):
    print("check failed: " + msg, file=sys.stderr)
    sys.exit(1)


def sse(path):
    body = open(path, "rb").read().decode("utf-8")
    frames, pos = [], 0
    while pos < len(body):
        if not body.startswith("data: ", pos):
            die(f"SSE frame at byte {pos} does not start with 'data: ': {body[pos:pos+40]!r}")
        end = body.find("\n\n", pos)
        if end < 0:
            die("SSE frame not terminated by a blank line")
        frames.append(body[pos + 6:end])
        pos = end + 2
    if not frames or frames[-1] != "[DONE]":
        die("SSE stream does not end with data: [DONE]")
    return [json.loads(f) for f in frames[:-1]]


def main():
    check, path, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    if check == "error":  # FILE STATUS_FILE EXPECTED_STATUS
        status = open(args[0]).read().strip()
        if status != args[1]:
            die(f"status {status}, expected {args[1]}: {open(path).read()[:300]}")
        e = json.load(open(path)).get("error")
        if not isinstance(e, dict) or not isinstance(e.get("message"), str) or not isinstance(e.get("type"), str) \
                or "param" not in e or "code" not in e:
            die(f"not OpenAI's error shape: {open(path).read()[:300]}")
    elif check == "chat":  # FILE MAX_TOKENS -> prints content
        j = json.load(open(path))
        c = j["choices"][0]
        u = j["usage"]
        if j["object"] != "chat.completion" or c["message"]["role"] != "assistant":
            die("not a chat.completion")
        if u["total_tokens"] != u["prompt_tokens"] + u["completion_tokens"] or u["prompt_tokens"] <= 0:
            die(f"usage does not add up: {u}")
        if c["finish_reason"] == "length" and u["completion_tokens"] != int(args[0]):
            die(f"finish_reason length but completion_tokens {u['completion_tokens']} != {args[0]}")
        if c["finish_reason"] not in ("stop", "length"):
            die(f"finish_reason {c['finish_reason']}")
        print(json.dumps({"content": c["message"]["content"], "cached": u["prompt_tokens_details"]["cached_tokens"],
                          "finish": c["finish_reason"], "completion_tokens": u["completion_tokens"]}))
    elif check == "chat_stream":  # FILE -> prints {"content", "usage"}
        chunks = sse(path)
        content, finishes, usage = "", [], None
        for i, ch in enumerate(chunks):
            if ch["object"] != "chat.completion.chunk":
                die(f"chunk {i} object {ch['object']}")
            if ch.get("usage"):
                usage = ch["usage"]
                if ch["choices"]:
                    die("the usage chunk must have empty choices")
                continue
            d = ch["choices"][0]
            if i == 0 and d["delta"].get("role") != "assistant":
                die("first chunk has no assistant role")
            content += d["delta"].get("content") or ""
            if d["finish_reason"] is not None:
                finishes.append(d["finish_reason"])
        if len(finishes) != 1:
            die(f"expected one finish_reason, got {finishes}")
        if usage is None or chunks[-1].get("usage") is None:
            die("include_usage: the last chunk must carry usage")
        print(json.dumps({"content": content, "usage": usage, "finish": finishes[0]}))
    elif check == "field":  # FILE PYTHON_EXPR (j bound) -> prints json of the value
        j = json.load(open(path))
        print(json.dumps(eval(args[0], {"j": j})))
    elif check == "stop_from_tokens":  # FILE (/generate with text logprobs) -> a stop string spanning tokens
        j = json.load(open(path))
        toks = [t[2] for t in j["meta_info"]["output_token_logprobs"]]
        for i in list(range(2, len(toks))) + [1]:  # prefer a stop with some text before it
            a, b = toks[i - 1], toks[i]
            if a and b and "\ufffd" not in a + b:
                stop = a[-1] + b[0]
                text = j["text"]
                if stop in text:
                    print(json.dumps({"stop": stop, "expected": text[:text.find(stop)]}))
                    return
        die(f"no two adjacent printable tokens in {toks}")
    else:
        die("unknown check " + check)


main()
