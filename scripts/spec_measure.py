#!/usr/bin/env python3
"""Speculative decoding measured through `kiln serve` on a trained model (issue 47): for each configuration
(plain, n-gram, ...) the server is started, every prompt is sent alone (batch 1, greedy, a fixed number of new
tokens), and the table gives tokens/s, the speedup over plain, SGLang's accept length (tokens per verify pass,
from /generate's meta_info) and whether the greedy tokens equal plain decoding's.

Prompts come from held-out source files (train_small_qwen3.py writes their list): "edit" quotes a file chunk,
then a marker and the chunk's first lines, so the continuation copies code back (where prompt lookup shines);
"free" is a file's beginning, continued freely. Python's standard library only (no torch): the same script
runs on the CPU against a tiny random checkpoint to check its logic (`--device cpu`).

Usage:
    python3 scripts/spec_measure.py --kiln build/device/bin/kiln --model DIR --heldout DIR/heldout_files.txt \
        [--device cuda] [--prompts 6] [--max-tokens 128] [--config 'ngram=--speculative-algorithm ngram ...']
Exit status 0 when every configuration ran; 1 otherwise (the table still prints what ran).
"""
import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request

NEAR_TIE = 0.1  # log-prob margin under which rounding may decide a greedy token (docs/NUMERICS.md)

DEFAULT_CONFIGS = [
    "plain=",
    "ngram=--speculative-algorithm ngram --speculative-num-draft-tokens 5 "
    "--speculative-ngram-max-match-window-size 8",
]


def log(*a):
    print("[spec_measure]", *a, flush=True)


def read_text(path, limit):
    try:
        with open(path, "rb") as f:
            return f.read(limit * 4).decode("utf-8", "replace")
    except OSError:
        return ""


def make_prompts(heldout, count, chars):
    """[(kind, text)]: `count` edit prompts and `count` free ones from distinct held-out files."""
    with open(heldout) as f:
        files = [ln.strip() for ln in f if ln.strip()]
    edit, free = [], []
    for path in files:
        text = read_text(path, chars)
        lines = text[:chars].splitlines()
        if len(lines) < 4 or len("\n".join(lines)) < chars // 3:
            continue
        body = "\n".join(lines[:-1])  # whole lines only
        if len(edit) < count:
            head = "\n".join(lines[:3])
            edit.append(("edit", body + "\n\n# ---- the same code, reformatted ----\n" + head + "\n"))
        elif len(free) < count:
            free.append(("free", body + "\n"))
        if len(edit) >= count and len(free) >= count:
            break
    if not edit:
        raise SystemExit(f"no usable held-out file in {heldout}")
    return edit + free


def post(port, path, body, timeout):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def get(port, path, timeout=10):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.read().decode()


class Server:
    def __init__(self, kiln, model, device, port, flags, log_path, ready_timeout):
        self.port = port
        # Leading NAME=VALUE words (KILN_EAGLE3_DRAFT_GRAPHS=1 ...) are this server's environment, the rest its flags.
        env = dict(os.environ)
        while flags and "=" in flags[0] and not flags[0].startswith("-"):
            key, _, value = flags.pop(0).partition("=")
            env[key] = value
        cmd = [kiln, "serve", "--model", model, "--device", device, "--port", str(port)] + flags
        log(" ".join(shlex.quote(c) for c in cmd))
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        deadline = time.time() + ready_timeout
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("READY "):
                return
        self.stop()
        raise RuntimeError(f"kiln serve did not become ready: see {log_path}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def run_config(args, name, flags, prompts, port, with_tops=False):
    srv = Server(args.kiln, args.model, args.device, port, flags, os.path.join(args.logs, f"serve_{name}.log"),
                 args.ready_timeout)
    try:
        sp = {"temperature": 0, "max_new_tokens": args.max_tokens, "ignore_eos": True}
        post(port, "/generate", {"text": prompts[0][1], "sampling_params": sp}, args.timeout)  # warm-up
        rows = []
        for kind, text in prompts:
            t0 = time.perf_counter()
            r = post(port, "/generate", {"text": text, "sampling_params": sp}, args.timeout)
            dt = time.perf_counter() - t0
            m = r["meta_info"]
            rows.append({"kind": kind, "seconds": dt, "tokens": m["completion_tokens"], "ids": r["output_ids"],
                         "verify": m.get("spec_verify_ct", 0), "accepted": m.get("spec_accepted_tokens", 0)})
        metrics = get(port, "/metrics")
        if with_tops:  # untimed: each prompt again with the top two log-probs per token (near ties)
            for row, (_, text) in zip(rows, prompts):
                body = {"text": text, "sampling_params": sp, "return_logprob": True, "top_logprobs_num": 2}
                m = post(port, "/generate", body, args.timeout)
                row["tops"] = m["meta_info"].get("output_top_logprobs", [])
                row["tops_ids"] = m["output_ids"]
        return rows, metrics
    finally:
        srv.stop()


def summarize(rows, kind):
    sel = [r for r in rows if kind in ("all", r["kind"])]
    tokens = sum(r["tokens"] for r in sel)
    secs = sum(r["seconds"] for r in sel)
    verify = sum(r["verify"] for r in sel)
    accepted = sum(r["accepted"] for r in sel)
    accept_len = 1.0 + accepted / verify if verify else None
    return tokens / secs if secs > 0 else 0.0, accept_len, [r["ids"] for r in sel]


def partings(results, base):
    """Where a configuration's greedy tokens part from the baseline's: the baseline's top-2 log-prob margin at the
    first difference. The verify rows run the prefill attention path and a (k + 1)-row GEMM, the plain step the
    decode path: their logits differ in the last bits, so greedy tokens may part at a near tie (below NEAR_TIE,
    docs/NUMERICS.md's exemption); a wide margin would be a bug. Returns (lines, whether one was wide)."""
    lines, wide = [], False
    if base not in results:
        return lines, wide
    brows = results[base][0]
    for name, (rows, _) in results.items():
        if name == base:
            continue
        for i, (r, b) in enumerate(zip(rows, brows)):
            a, w = r["ids"], b["ids"]
            if a == w:
                continue
            j = next((t for t in range(min(len(a), len(w))) if a[t] != w[t]), min(len(a), len(w)))
            tops = b.get("tops", [])
            note = "no top-2 log-probs"
            if b.get("tops_ids") != w:
                note = "the baseline's log-prob pass gave other tokens"
            elif j < len(tops) and len(tops[j]) >= 2:
                margin = tops[j][0][0] - tops[j][1][0]
                near = margin < NEAR_TIE
                wide = wide or not near
                note = f"baseline top-2 margin {margin:.4f} " + ("(near tie)" if near else "(WIDE: not rounding, a bug)")
            lines.append(f"{name} {r['kind']} prompt {i}: parts from {base} at token {j}: {note}")
    return lines, wide


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--heldout", required=True, help="a file listing held-out source files, one per line")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=6, help="prompts of each kind")
    ap.add_argument("--chars", type=int, default=1500, help="characters of source per prompt")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--port", type=int, default=8191)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--ready-timeout", type=float, default=300)
    ap.add_argument("--logs", default=".")
    ap.add_argument("--config", action="append", help="NAME=[ENV=VALUE ...] kiln serve flags (first: the baseline)")
    args = ap.parse_args()
    configs = args.config or DEFAULT_CONFIGS
    prompts = make_prompts(args.heldout, args.prompts, args.chars)
    log(f"{len(prompts)} prompts ({sum(k == 'edit' for k, _ in prompts)} edit), {args.max_tokens} new tokens each")
    os.makedirs(args.logs, exist_ok=True)
    results, ok = {}, True
    for i, c in enumerate(configs):
        name, _, flags = c.partition("=")
        try:
            results[name] = run_config(args, name, shlex.split(flags), prompts, args.port + i, with_tops=i == 0)
        except Exception as e:  # noqa: BLE001 - one failed configuration must not hide the others
            log(f"{name}: FAILED: {e}")
            ok = False
    base = configs[0].partition("=")[0]
    print("\n| config | prompts | tokens/s | speedup | accept length | greedy = " + base + " |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for name, (rows, _) in results.items():
        for kind in ("edit", "free", "all"):
            tps, acc, ids = summarize(rows, kind)
            speed = ""
            same = ""
            if base in results:
                btps, _, bids = summarize(results[base][0], kind)
                speed = f"{tps / btps:.2f}x" if btps > 0 else ""
                same = "yes" if ids == bids else f"no ({sum(a != b for a, b in zip(ids, bids))} differ)"
            acc_s = f"{acc:.2f}" if acc is not None else "-"
            print(f"| {name} | {kind} | {tps:.1f} | {speed} | {acc_s} | {same} |")
    lines, wide = partings(results, base)
    for ln in lines:
        print(ln)
    ok = ok and not wide
    for name, (_, metrics) in results.items():
        lines = [ln for ln in metrics.splitlines() if ln.startswith("kiln_spec_decode_") and "{" in ln]
        if lines:
            short = [re.sub(r'\{model_name="[^"]*",?', "{", ln).replace("{}", "") for ln in lines]
            print(f"\n{name} /metrics: " + "; ".join(short))
            cycle = cycle_split(lines)
            if cycle:
                print(f"{name} per verify step: {cycle}")
    return 0 if ok and len(results) == len(configs) else 1


def cycle_split(lines):
    """Where a verify step's time goes, in ms, from the kiln_spec_decode_* counters: the whole step (start to
    end), its draft passes (EAGLE-3: the chain and the pass after the step; the passes after prefill and plain
    steps are counted in too, few at batch 1), and the rest (the verify forward and the host's work around
    it). Empty without timed verify steps."""
    v = {}
    for ln in lines:
        m = re.match(r'(kiln_spec_decode_\w+)\{[^}]*\} (\S+)', ln)
        if m:
            v[m.group(1)] = float(m.group(2))
    steps = v.get("kiln_spec_decode_timed_verify_steps_total", 0.0)
    if steps <= 0:
        return ""
    def ms(key):
        return 1e3 * v.get(key, 0.0) / steps

    step = ms("kiln_spec_decode_verify_step_seconds_total")
    draft = ms("kiln_spec_decode_draft_seconds_total")
    chain = ms("kiln_spec_decode_draft_chain_seconds_total")
    return (f"{step:.3f} ms = drafts {draft:.3f} (chain {chain:.3f}, after the step {draft - chain:.3f}) + "
            f"verify forward and host {step - draft:.3f}")


if __name__ == "__main__":
    sys.exit(main())
