#!/usr/bin/env python3
"""Structured output's serving cost: output tokens/s of schema-constrained chat requests against the same
requests unconstrained, on a running `kiln serve`, and the engine's own mask-time counters (/metrics:
kiln_grammar_mask_seconds, kiln_grammar_masks_total) over the constrained phase.

  bench/grammar/serve_overhead.py --base-url http://127.0.0.1:8000 [--requests 16] [--concurrency 4]
                                  [--max-tokens 128] [--seed 1]

Each phase sends the same prompts with temperature 1 and a seed per request; tokens/s = completion tokens
of the phase / its wall time. Prints one JSON object."""
import argparse
import json
import re
import threading
import time
import urllib.request

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8},
        "rating": {"enum": ["good", "bad", "unknown"]},
    },
    "required": ["title", "year", "tags", "rating"],
    "additionalProperties": False,
}


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        text = r.read().decode()
    buckets, count, total = [], 0.0, 0.0
    for line in text.splitlines():
        m = re.match(r'kiln_grammar_mask_seconds_bucket\{.*le="([^"]+)"\} (\S+)', line)
        if m:
            buckets.append((float("inf") if m.group(1) == "+Inf" else float(m.group(1)), float(m.group(2))))
        elif line.startswith("kiln_grammar_mask_seconds_count"):
            count = float(line.split()[-1])
        elif line.startswith("kiln_grammar_mask_seconds_sum"):
            total = float(line.split()[-1])
    return buckets, count, total


def phase(args, constrained):
    lock = threading.Lock()
    done = {"tokens": 0, "valid": 0, "finished": 0}
    todo = list(range(args.requests))

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            body = {
                "messages": [{"role": "user", "content": f"Describe film number {i} as JSON."}],
                "max_tokens": args.max_tokens,
                "temperature": 1.0,
                "seed": args.seed + i,
                "chat_template_kwargs": {"enable_thinking": False},
            }
            if constrained:
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "film", "schema": SCHEMA}}
            r = post(args.base_url + "/v1/chat/completions", body)
            c = r["choices"][0]
            ok = False
            if constrained and c["finish_reason"] == "stop":
                try:
                    ok = isinstance(json.loads(c["message"]["content"]), dict)
                except ValueError:
                    ok = False
            with lock:
                done["tokens"] += r["usage"]["completion_tokens"]
                done["valid"] += int(ok)
                done["finished"] += int(c["finish_reason"] == "stop")

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {"tokens": done["tokens"], "seconds": round(wall, 3), "tok_per_s": round(done["tokens"] / wall, 2),
            "stopped": done["finished"], "valid_json": done["valid"]}


def quantile(buckets, count, q):
    for le, c in buckets:
        if c >= q * count:
            return le
    return float("nan")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    phase(args, False)  # warm-up: first steps, allocations
    free = phase(args, False)
    _, c0, s0 = metrics(args.base_url)
    constrained = phase(args, True)
    buckets, c1, s1 = metrics(args.base_url)
    n = c1 - c0
    print(json.dumps({
        "unconstrained": free,
        "constrained": constrained,
        "ratio": round(constrained["tok_per_s"] / free["tok_per_s"], 4),
        "masks": int(n),
        "mask_mean_us": round((s1 - s0) / n * 1e6, 2) if n else None,
        # Bucket upper bounds over the whole run (the buckets are cumulative since the server started).
        "mask_p50_le_us": quantile(buckets, c1, 0.5) * 1e6,
        "mask_p99_le_us": quantile(buckets, c1, 0.99) * 1e6,
    }, indent=1))


if __name__ == "__main__":
    main()
