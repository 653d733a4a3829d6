#!/usr/bin/env bash
# The standing chaos test (issue 41): kiln serve on the CPU demo Qwen3-VL checkpoint, loopback only, bounded
# counts (~60 s on 2 cores). Hostile inputs (JSON nested 100,000 deep in several fields, Transfer-Encodings
# other than chunked, image URLs naming private addresses, idle connections holding the cap while /health is
# polled) mixed with normal streaming and non-streaming traffic and clients vanishing mid-stream
# (tests/e2e/chaos.py), image bombs and broken images, a short request beside a large image and a client gone
# mid-prefill, then a SIGTERM while streams run. Checks: the server never dies before the SIGTERM;
# every accepted request ends with a completion, an error or an abort (accepted = completed + errors +
# aborted, on /metrics and in the exit line); every KV page is free once traffic settles; the process exits
# within --drain-timeout + 1 s. Usage: test_chaos.sh KILN FIXTURES_DIR SRC_DIR
KILN=$1
FIXTURES=$2
source "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || skip "python3 is not installed"
command -v curl >/dev/null || skip "curl is not installed"
CHAOS="python3 $(dirname "$0")/chaos.py"
CAP=24
DRAIN=2

VL="$E2E_LOG_DIR/vl"
"$KILN" demo-model "$VL" --arch vl >/dev/null || fail "demo-model --arch vl"
echo "== the CLI: tools nested 50,000 deep on stdin are refused by name, not a crash"
python3 -c 'n = 50000; print("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": " + "[" * n + "]" * n + "}}]}")' >"$E2E_LOG_DIR/deep.json"
for cmd in chat-template "tokenize --input-json"; do
  rc=0
  $KILN $cmd --model "$VL" <"$E2E_LOG_DIR/deep.json" >/dev/null 2>"$E2E_LOG_DIR/cli.err" || rc=$?
  ((rc == 1)) && grep -q "nests deeper than 128 levels" "$E2E_LOG_DIR/cli.err" ||
    fail "kiln $cmd on deep JSON: rc $rc, $(head -c 300 "$E2E_LOG_DIR/cli.err")"
done
rc=0
timeout 60 "$KILN" serve --port 0 --device cpu --model "$VL" --max-context-len 1000000000000000 >/dev/null \
  2>"$E2E_LOG_DIR/ctx.err" || rc=$?
((rc == 1)) && grep -q "past kiln's limit of 4194304" "$E2E_LOG_DIR/ctx.err" ||
  fail "--max-context-len 1e15: rc $rc, $(tail -c 300 "$E2E_LOG_DIR/ctx.err") (a bare std::bad_alloc before)"

start_server chaos --model "$VL" --served-model-name demo --max-total-tokens 8192 --max-connections "$CAP" \
  --drain-timeout "$DRAIN" --max-running-requests 16 --image-max-resized-pixels 262144
alive() { kill -0 "$SERVER_PID" 2>/dev/null || fail "the server died before the SIGTERM"; }

# accounted: /metrics' accepted = completed + errors + aborted and no request active; prints the counts.
accounted() {
  local m
  m=$(curl -sf "$BASE/metrics") || fail "/metrics"
  python3 - "$m" <<'PY' || return 1
import sys
v = {}
for line in sys.argv[1].splitlines():
    if line and not line.startswith("#"):
        k, _, x = line.rpartition(" ")
        v[k.replace('model_name="demo",', "").replace('{model_name="demo"}', "")] = float(x)
acc = v["kiln_server_requests_accepted_total"]
ended = sum(v['kiln_server_requests_finished_total{outcome="%s"}' % o] for o in ("completed", "error", "aborted"))
used, total = v["kiln_kv_pages_used"], v["kiln_kv_pages_total"]
free = v["kiln_kv_pages_free"] + v["kiln_kv_pages_cached"]
print(f"accepted {acc:.0f} ended {ended:.0f} active {v['kiln_server_active_requests']:.0f} "
      f"pages used {used:.0f} free+cached {free:.0f} of {total:.0f}")
sys.exit(0 if acc == ended and v["kiln_server_active_requests"] == 0 and used == 0 and free == total else 1)
PY
}
settle() {  # until every request has ended and its pages are back (bounded)
  for _ in $(seq 1 100); do
    accounted >/dev/null && return 0
    sleep 0.1
  done
  accounted || fail "after settling: accepted != completed + errors + aborted, or KV pages still in use"
}

echo "== mixed: normal and vanishing streams with hostile requests among them"
$CHAOS "$PORT" mixed || fail "mixed traffic"
alive
settle
echo "   $(accounted)"

echo "== idle connections at the cap ($CAP) while /health and /metrics are polled"
$CHAOS "$PORT" cap "$CAP" || fail "probes past the connection cap"
alive

echo "== image bombs and broken images, a short request beside a large image, a client gone mid-prefill"
CHAOS_PHOTO="$3/tests/fixtures/vision/images/photo.jpg" $CHAOS "$PORT" engine || fail "engine-side inputs"
alive
settle
echo "   $(accounted)"

echo "== SIGTERM while streams run: exit within --drain-timeout $DRAIN s + 1 s"
$CHAOS "$PORT" streams >"$E2E_LOG_DIR/streams.out" 2>&1 &
STREAMS=$!
for _ in $(seq 1 100); do  # until the streams are in flight
  active=$(metric 'kiln_server_active_requests{model_name="demo"}')
  [[ "${active%.*}" -ge 1 ]] && break
  sleep 0.05
done
alive
T0=$(date +%s.%N)
kill -TERM "$SERVER_PID"
rc=0
wait "$SERVER_PID" || rc=$?
T1=$(date +%s.%N)
SERVER_PID=""
[[ $rc -eq 0 ]] || fail "server exited with status $rc after SIGTERM"
python3 -c "import sys; t = float(sys.argv[2]) - float(sys.argv[1]); print(f'   exited {t:.2f} s after SIGTERM'); \
sys.exit(0 if t <= $DRAIN + 1 else 1)" "$T0" "$T1" || fail "the server took longer than --drain-timeout + 1 s to exit"
wait "$STREAMS" || fail "streams across the SIGTERM: $(cat "$E2E_LOG_DIR/streams.out")"
line=$(grep 'kiln serve: stopped. accepted' "$SERVER_LOG") || fail "no final accounting line"
echo "   ${line#kiln serve: }"
python3 - "$line" <<'PY' || fail "the exit line does not account for every accepted request: $line"
import re, sys
a, c, e, b = map(int, re.search(r"accepted (\d+): completed (\d+), error (\d+), aborted (\d+)", sys.argv[1]).groups())
sys.exit(0 if a == c + e + b else 1)
PY
echo "PASS test_chaos"
