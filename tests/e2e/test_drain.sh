#!/usr/bin/env bash
# SIGTERM in the middle of many prefills, on the CPU demo checkpoint with --drain-timeout 1: every stream ends
# with a final chunk (finish_reason "abort" when it did not finish) and `data: [DONE]`, and its chunked body ends
# properly (curl exits 0: no "transfer closed with outstanding read data"), the process exits within the drain
# timeout plus one second (plus 2 s of slack for a loaded machine), with status 0 and every accepted request
# counted. Usage: test_drain.sh KILN FIXTURES_DIR SRC_DIR
KILN=$1
FIXTURES=$2
SRC=$3
source "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed"
command -v python3 >/dev/null || skip "python3 is not installed"

N=40
start_server drain --model "$FIXTURES/demo" --drain-timeout 1 --max-running-requests 64
prompt=$(python3 -c "print(' '.join(['hello world'] * 1500))")
body=$(python3 -c "import json,sys; print(json.dumps({'model': 'demo', 'stream': True, 'max_tokens': 400, 'ignore_eos': True, 'messages': [{'role': 'user', 'content': sys.argv[1]}]}))" "$prompt")
pids=()
for i in $(seq 1 $N); do
  curl -sS -N --max-time 60 -H 'Content-Type: application/json' -d "$body" "$BASE/v1/chat/completions" \
    >"$E2E_LOG_DIR/stream.$i" 2>"$E2E_LOG_DIR/stream.$i.err" &
  pids+=($!)
done
# Every stream accepted (submitted to the engine) and none finished: the engine is in their prefills.
for _ in $(seq 1 300); do
  [[ "$(metric 'kiln_server_requests_accepted_total{model_name="demo"}')" == "$N" ]] && break
  sleep 0.1
done
[[ "$(metric 'kiln_server_requests_accepted_total{model_name="demo"}')" == "$N" ]] || fail "not all $N streams were accepted"
t0=$(date +%s.%N)
kill -TERM "$SERVER_PID"
rc=0
wait "$SERVER_PID" || rc=$?
t1=$(date +%s.%N)
SERVER_PID=""
[[ $rc -eq 0 ]] || fail "server exited with status $rc after SIGTERM"
elapsed=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
python3 -c "import sys; sys.exit(0 if $elapsed <= 1 + 1 + 2 else 1)" || fail "exit took $elapsed s after SIGTERM (drain timeout 1 s)"
bad=0
for i in $(seq 1 $N); do
  crc=0
  wait "${pids[$((i - 1))]}" || crc=$?
  f="$E2E_LOG_DIR/stream.$i"
  if [[ $crc -ne 0 ]] || ! grep -q '"finish_reason":"\(abort\|length\|stop\)"' "$f" || [[ "$(tail -c 14 "$f")" != "data: [DONE]" ]]; then
    echo "stream $i: curl status $crc, $(wc -c <"$f") bytes, ends: $(tail -c 80 "$f" | tr '\n' ' ')" >&2
    cat "$E2E_LOG_DIR/stream.$i.err" >&2
    bad=$((bad + 1))
  fi
done
[[ $bad -eq 0 ]] || fail "$bad of $N streams did not end with a final chunk, [DONE] and the chunk terminator"
grep -q "kiln serve: stopped. accepted $N: completed [0-9]*, error 0, aborted [0-9]*" "$SERVER_LOG" ||
  fail "accounting: $(grep 'stopped. accepted' "$SERVER_LOG")"
echo "PASS: SIGTERM mid-prefill: $N streams ended with [DONE], exit after $elapsed s"
