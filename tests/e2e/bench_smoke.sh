#!/usr/bin/env bash
# The client tools against the real server, under 60 s: `kiln serve` on the CPU demo checkpoint, then
# `kiln bench serve` (a three-level sweep with exact accounting, through /generate and /v1/completions),
# `kiln bench ab` (the server against itself) and `kiln eval reference` (write v2 dumps with top-2 through
# /v1/completions and /generate, compare: no divergence, near tie or other).
# Usage: bench_smoke.sh KILN FIXTURES_DIR [SRC_DIR]   (FIXTURES_DIR/demo is written by fixtures.sh)
KILN=$1
FIXTURES=$2
source "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || skip "python3 is not installed"
T="$E2E_LOG_DIR"

start_server bench --model "$FIXTURES/demo"

echo "== bench serve through /generate: every level valid, JSON/Markdown/SVG written"
timeout 40 "$KILN" bench serve --base-url "$BASE" --input-len 24 --output-len 6 --concurrency 1,2,4 \
  --num-prompts 4,4,6 --warmups 1 --out "$T/sweep" >"$T/sweep.stdout" || fail "bench serve: $(cat "$T/sweep.stdout")"
python3 - "$T/sweep.json" <<'PY' || fail "sweep JSON"
import json, sys
r = json.load(open(sys.argv[1]))
levels = r["levels"]
assert [l["concurrency"] for l in levels] == [1, 2, 4], levels
for l in levels:
    assert l["valid"] and l["exact"] == l["num_prompts"], l
    assert l["output_tokens"] == 6 * l["num_prompts"] and l["input_tokens"] == 24 * l["num_prompts"], l
    assert l["output_throughput_tok_s"] > 0 and l["ttft_ms"]["n"] == l["num_prompts"], l
    assert not any("flush" in n for n in l["notes"]), l["notes"]  # kiln serve has /flush_cache
print("sweep:", ", ".join("C=%d %.1f tok/s" % (l["concurrency"], l["output_throughput_tok_s"]) for l in levels))
PY
grep -q "<svg" "$T/sweep.svg" || fail "no SVG"

echo "== bench serve through /v1/completions (token-id prompts, OpenAI SDK-style base URL)"
timeout 20 "$KILN" bench serve --base-url "$BASE/v1" --api completions --input-len 16 --output-len 4 \
  --concurrency 2 --num-prompts 4 --warmups 1 >"$T/completions.stdout" || fail "bench serve --api completions"

echo "== bench ab: the server against itself"
timeout 30 "$KILN" bench ab --a "$BASE" --b "$BASE" --input-len 16 --output-len 4 --concurrency 2 \
  --num-prompts 4 --warmups 1 --resamples 200 --out "$T/ab" >/dev/null || fail "bench ab"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); m={x["name"]:x for x in r["metrics"]}; assert r["valid"] and r["paired_requests"] == 4 and "change_ci95" in m["tpot_ms.mean"], r' \
  "$T/ab.json" || fail "A/B JSON"

echo "== eval reference: greedy is deterministic, so the server agrees with its own dump"
timeout 20 "$KILN" eval reference --base-url "$BASE" --dump "$T/ref.json" --write --max-tokens 8 >/dev/null ||
  fail "eval reference --write"
timeout 20 "$KILN" eval reference --base-url "$BASE" --dump "$T/ref.json" --min-agreement 1 --max-drift 1e-3 \
  --out "$T/ref_cmp.json" >"$T/ref_cmp.txt" || fail "eval reference compare"
grep -q "^divergences: 0 at near ties (margin <= 0.05, .*), 0 other$" "$T/ref_cmp.txt" ||
  fail "near-tie line: $(cat "$T/ref_cmp.txt")"
printf 'The capital of France is\ndef f(x):\n' >"$T/ref_prompts.txt"
timeout 20 "$KILN" eval reference --base-url "$BASE" --api generate --dump "$T/ref_gen.json" --write \
  --prompts "$T/ref_prompts.txt" --max-tokens 6 >/dev/null || fail "eval reference --write --api generate"
timeout 20 "$KILN" eval reference --base-url "$BASE" --dump "$T/ref_gen.json" --min-agreement 1 \
  --out "$T/ref_gen_cmp.json" >/dev/null || fail "eval reference compare --api generate"
python3 - "$T/ref.json" "$T/ref_cmp.json" "$T/ref_gen.json" "$T/ref_gen_cmp.json" <<'PY' || fail "eval reference v2"
import json, sys
for dump, cmp in ((sys.argv[1], sys.argv[2]), (sys.argv[3], sys.argv[4])):
    d, c = json.load(open(dump)), json.load(open(cmp))
    assert d["version"] == 2, d["version"]
    for r in d["records"]:  # the top-2 per step, best first, the greedy token among them
        assert len(r["top"]) == len(r["tokens"]) > 0, r
        for tok, top in zip(r["tokens"], r["top"]):
            # /v1/completions keys alternatives by text: two byte tokens shown as U+FFFD become one
            assert len(top) == 2 or (d["api"] == "completions" and len(top) == 1), (tok, top)
            assert tok in [t for t, _ in top] and top[0][1] >= top[-1][1], (tok, top)
        if d["api"] == "generate":
            assert all(top[0][0] == tok for tok, top in zip(r["tokens"], r["top"])), r
    assert c["near_tie_divergences"] == 0 and c["other_divergences"] == 0, c
print("eval reference: v2 dumps (completions, generate), 0 divergences")
PY

stop_server
echo "bench smoke: ok"
