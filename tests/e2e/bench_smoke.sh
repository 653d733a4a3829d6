#!/usr/bin/env bash
# Smoke test of the client tools against the real server: `kiln serve` on the CPU demo checkpoint, then
# `kiln bench serve` (a three-level sweep with exact accounting), `kiln bench ab` (the server against
# itself) and `kiln eval reference` (write a dump, compare with it). Budget: under 60 s.
# usage: bench_smoke.sh KILN_BINARY WORK_DIR
set -euo pipefail
kiln=$1
work=$2
mkdir -p "$work"
model="$work/demo-model"
[[ -f "$model/config.json" ]] || "$kiln" demo-model "$model" >/dev/null

# Pick a free port (bind to 0 and read it back), then start the server.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$kiln" serve --model "$model" --device cpu --port "$port" >"$work/server.log" 2>&1 &
server=$!
cleanup() { kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; }
trap cleanup EXIT
url="http://127.0.0.1:$port"
for _ in $(seq 1 150); do
  curl -sf "$url/health" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { echo "server exited:"; cat "$work/server.log"; exit 1; }
  sleep 0.2
done
curl -sf "$url/health" >/dev/null || { echo "server not healthy after 30 s"; cat "$work/server.log"; exit 1; }

fail() { echo "FAIL: $*"; exit 1; }

# 1. Sweep through /generate: every level valid (exit status 0), JSON/Markdown/SVG written.
timeout 40 "$kiln" bench serve --base-url "$url" --input-len 24 --output-len 6 --concurrency 1,2,4 \
  --num-prompts 4,4,8 --warmups 2 --out "$work/sweep" >"$work/sweep.stdout" || fail "bench serve (see $work/sweep.md)"
python3 - "$work/sweep.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
levels = r["levels"]
assert [l["concurrency"] for l in levels] == [1, 2, 4], levels
for l in levels:
    assert l["valid"] and l["exact"] == l["num_prompts"], l
    assert l["output_tokens"] == 6 * l["num_prompts"] and l["input_tokens"] == 24 * l["num_prompts"], l
    assert l["output_throughput_tok_s"] > 0 and l["ttft_ms"]["n"] == l["num_prompts"], l
print("sweep ok:", ", ".join("C=%d %.1f tok/s" % (l["concurrency"], l["output_throughput_tok_s"]) for l in levels))
PY
grep -q "<svg" "$work/sweep.svg" || fail "no SVG"

# 2. The same through /v1/completions with token-id prompts.
timeout 20 "$kiln" bench serve --base-url "$url/v1" --api completions --input-len 16 --output-len 4 \
  --concurrency 2 --num-prompts 4 --warmups 2 >"$work/completions.stdout" || fail "bench serve --api completions"

# 3. A/B of the server against itself: valid, and the report carries intervals.
timeout 30 "$kiln" bench ab --a "$url" --b "$url" --input-len 16 --output-len 4 --concurrency 2 \
  --num-prompts 6 --warmups 2 --resamples 200 --out "$work/ab" >/dev/null || fail "bench ab"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); m={x["name"]:x for x in r["metrics"]}; assert r["valid"] and "change_ci95" in m["tpot_ms.mean"], r' "$work/ab.json"

# 4. eval reference: greedy outputs are deterministic, so the server agrees with its own dump.
timeout 20 "$kiln" eval reference --base-url "$url" --dump "$work/ref.json" --write --max-tokens 8 >/dev/null \
  || fail "eval reference --write"
timeout 20 "$kiln" eval reference --base-url "$url" --dump "$work/ref.json" --min-agreement 1 --max-drift 1e-3 \
  --out "$work/ref_cmp.json" || fail "eval reference compare"
echo "bench smoke: ok"
