#!/usr/bin/env bash
# Tensor parallelism through the server (issue 14): `kiln serve --tp 2` and `--tp 4` on an HF fixture give
# TP = 1's greedy tokens for concurrent /generate requests, log-probs within 0.25 (2 bf16 ulps of a logit
# below 32 in magnitude: tests/unit/test_tp.cpp derives the bound); then a rank failing in a step
# (KILN_TP_FAULT) makes the server answer with the error and exit 1 on its own, naming the rank.
# Usage: test_tp.sh KILN FIXTURES_DIR SRC_DIR
KILN=$1
FIXTURES=$2
SRC=$3
source "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed"
command -v python3 >/dev/null || skip "python3 is not installed"
T="$E2E_LOG_DIR"
MODEL="$SRC/tests/fixtures/hf/qwen3_gqa2_d128_untied"
mapfile -t PROMPTS < <(python3 -c '
import json, sys
for c in json.load(open(sys.argv[1]))["cases"]:
    print(",".join(map(str, c["prompt_ids"])))' "$MODEL/hf_reference.json")

# generate_all NAME: every prompt at once; responses in $T/NAME.I.json
generate_all() {
  local pids=() i=0
  for p in "${PROMPTS[@]}"; do
    curl -s -o "$T/$1.$i.json" -H "Content-Type: application/json" -X POST "$BASE/generate" --data-binary \
      "{\"input_ids\":[$p],\"sampling_params\":{\"max_new_tokens\":12,\"temperature\":0,\"ignore_eos\":true},\"return_logprob\":true}" &
    pids+=($!)
    i=$((i + 1))
  done
  for pid in "${pids[@]}"; do wait "$pid" || fail "a /generate request failed"; done
}

start_server tp1 --model "$MODEL" --max-total-tokens 512 --page-size 4
generate_all tp1
stop_server
for tp in 2 4; do
  echo "== --tp $tp"
  start_server "tp$tp" --model "$MODEL" --max-total-tokens 512 --page-size 4 --tp "$tp"
  grep -q "tensor parallelism $tp" "$SERVER_LOG" || fail "--tp $tp: no tensor-parallel line in the log"
  generate_all "tp$tp"
  stop_server
  python3 - "$T" "$tp" "${#PROMPTS[@]}" <<'PY' || fail "--tp $tp differs from --tp 1"
import json, sys
t, tp, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
worst = 0.0
for i in range(n):
    a, b = (json.load(open(f"{t}/{name}.{i}.json")) for name in ("tp1", "tp" + tp))
    assert a["output_ids"] == b["output_ids"], (i, a["output_ids"], b["output_ids"])
    la, lb = ([x[0] for x in r["meta_info"]["output_token_logprobs"]] for r in (a, b))
    assert len(la) == len(lb) == 12, (len(la), len(lb))
    worst = max(worst, max(abs(x - y) for x, y in zip(la, lb)))
assert worst <= 0.25, worst
print(f"  --tp {tp}: {n} requests, greedy tokens equal, |logprob - TP=1| max {worst:.2e}")
PY
done

echo "== a rank that fails in a step stops the server"
export KILN_TP_FAULT=1:30  # the 7th of the request's 12 steps (5 collectives each)
start_server fault --model "$MODEL" --max-total-tokens 512 --page-size 4 --tp 2
unset KILN_TP_FAULT
code=$(curl -s -o "$T/fault.json" -w '%{http_code}' -H "Content-Type: application/json" -X POST "$BASE/generate" \
  --data-binary "{\"input_ids\":[${PROMPTS[2]}],\"sampling_params\":{\"max_new_tokens\":12,\"temperature\":0}}") || true
grep -q "tensor-parallel rank 1 failed" "$T/fault.json" ||
  fail "the failed request's response ($code) does not name the rank: $(head -c 300 "$T/fault.json")"
rc=0
for _ in $(seq 1 200); do
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$SERVER_PID" 2>/dev/null && fail "the server still runs 20 s after a rank failed"
wait "$SERVER_PID" || rc=$?
SERVER_PID=""
((rc == 1)) || fail "the server exited with status $rc after a rank failed, expected 1"
grep -q "the engine stopped: tensor-parallel rank 1 failed: injected failure" "$SERVER_LOG" ||
  fail "no clear message in the server log: $(tail -5 "$SERVER_LOG")"
echo "PASS"
