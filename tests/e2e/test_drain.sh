#!/usr/bin/env bash
# SIGTERM in the middle of many prefills, on the CPU demo checkpoint with --drain-timeout 1: every stream ends
# with a final chunk (finish_reason "abort" when it did not finish) and `data: [DONE]`, and its chunked body ends
# properly (curl exits 0: no "transfer closed with outstanding read data"), the process exits within the drain
# timeout plus one second (plus 2 s of slack for a loaded machine), with status 0 and every accepted request
# counted. Then a second signal during a 30 s drain: the same, within a second of it (plus slack).
# Usage: test_drain.sh KILN FIXTURES_DIR SRC_DIR
KILN=$1
FIXTURES=$2
SRC=$3
source "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed"
command -v python3 >/dev/null || skip "python3 is not installed"

# streams N PREFIX: N chat streams with long prompts in the background (pids in STREAMS), then waits until the
# server has accepted all of them.
streams() {
  local n=$1 prefix=$2
  STREAMS=()
  for i in $(seq 1 "$n"); do
    curl -sS -N --max-time 60 -H 'Content-Type: application/json' -d "$body" "$BASE/v1/chat/completions" \
      >"$E2E_LOG_DIR/$prefix.$i" 2>"$E2E_LOG_DIR/$prefix.$i.err" &
    STREAMS+=($!)
  done
  for _ in $(seq 1 300); do
    [[ "$(metric 'kiln_server_requests_accepted_total{model_name="demo"}')" == "$n" ]] && break
    sleep 0.1
  done
  [[ "$(metric 'kiln_server_requests_accepted_total{model_name="demo"}')" == "$n" ]] || fail "not all $n streams were accepted"
}
# check_streams N PREFIX: every stream ended with a final chunk, [DONE] and the chunk terminator.
check_streams() {
  local n=$1 prefix=$2 bad=0
  for i in $(seq 1 "$n"); do
    local crc=0 f="$E2E_LOG_DIR/$prefix.$i"
    wait "${STREAMS[$((i - 1))]}" || crc=$?
    if [[ $crc -ne 0 ]] || ! grep -q '"finish_reason":"\(abort\|length\|stop\)"' "$f" || [[ "$(tail -c 14 "$f")" != "data: [DONE]" ]]; then
      echo "stream $i: curl status $crc, $(wc -c <"$f") bytes, ends: $(tail -c 80 "$f" | tr '\n' ' ')" >&2
      cat "$f.err" >&2
      bad=$((bad + 1))
    fi
  done
  [[ $bad -eq 0 ]] || fail "$bad of $n streams did not end with a final chunk, [DONE] and the chunk terminator"
}
# stop_timed LIMIT [SECOND_AFTER]: SIGTERM (and a second one SECOND_AFTER s later); exit status 0 within LIMIT s
# of the last signal.
stop_timed() {
  local limit=$1 second=${2:-}
  kill -TERM "$SERVER_PID"
  if [[ -n "$second" ]]; then
    sleep "$second"
    kill -TERM "$SERVER_PID"
  fi
  local t0 t1 rc=0
  t0=$(date +%s.%N)
  wait "$SERVER_PID" || rc=$?
  t1=$(date +%s.%N)
  SERVER_PID=""
  [[ $rc -eq 0 ]] || fail "server exited with status $rc after SIGTERM"
  ELAPSED=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
  python3 -c "import sys; sys.exit(0 if $ELAPSED <= $limit else 1)" || fail "exit took $ELAPSED s after the last signal"
}

prompt=$(python3 -c "print(' '.join(['hello world'] * 1500))")
body=$(python3 -c "import json,sys; print(json.dumps({'model': 'demo', 'stream': True, 'max_tokens': 400, 'ignore_eos': True, 'messages': [{'role': 'user', 'content': sys.argv[1]}]}))" "$prompt")

N=40
start_server drain --model "$FIXTURES/demo" --drain-timeout 1 --max-running-requests 64
streams $N stream
stop_timed $((1 + 1 + 2))  # the drain timeout, its second, slack for a loaded machine
check_streams $N stream
grep -q "kiln serve: stopped. accepted $N: completed [0-9]*, error 0, aborted [0-9]*" "$SERVER_LOG" ||
  fail "accounting: $(grep 'stopped. accepted' "$SERVER_LOG")"
echo "PASS: SIGTERM mid-prefill: $N streams ended with [DONE], exit $ELAPSED s after the signal"

N=20
start_server drain2 --model "$FIXTURES/demo" --drain-timeout 30 --max-running-requests 64
streams $N second
stop_timed $((1 + 2)) 0.5  # a second signal: at once (its second, slack), not after the 30 s drain
check_streams $N second
grep -q "second signal: aborting" "$SERVER_LOG" || fail "the second signal was not taken"
echo "PASS: a second SIGTERM mid-drain: $N streams ended with [DONE], exit $ELAPSED s after it"
