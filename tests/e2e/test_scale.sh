#!/usr/bin/env bash
# The HTTP layer at scale on the CPU demo checkpoint: kiln_load_probe holds 1,000 idle connections, runs 300
# concurrent streaming requests (the engine running all 300 at once, exactly 8 tokens each) and 200 slow
# clients (1 s header/body deadlines -> 408) at once, polling /health and /metrics (at least 98 % of polls
# within 50 ms, none past 500 ms: kiln_load_probe);
# then /metrics must account for every request, count the 200 timeouts, and show every KV page free.
# Usage: test_scale.sh KILN FIXTURES_DIR SRC_DIR PROBE
KILN=$1
FIXTURES=$2
SRC=$3
PROBE=$4
source "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed"
start_server scale --model "$FIXTURES/demo" --served-model-name demo --max-total-tokens 16384 --page-size 16 \
  --max-running-requests 300 --http-header-timeout 1 --http-body-timeout 1
"$PROBE" "$PORT" --idle "${SCALE_IDLE:-1000}" --streams "${SCALE_STREAMS:-300}" --slow "${SCALE_SLOW:-200}" \
  --tokens 8 --max-poll-ms "${SCALE_MAX_POLL_MS:-50}" || fail "load probe"
for _ in $(seq 1 100); do  # the last outcomes are counted just after the last bytes went out
  [[ "$(metric 'kiln_server_active_requests{model_name="demo"}')" == 0 ]] && break
  sleep 0.1
done
accepted=$(metric 'kiln_server_requests_accepted_total{model_name="demo"}')
completed=$(metric 'kiln_server_requests_finished_total{model_name="demo",outcome="completed"}')
timeouts=$(metric 'kiln_server_requests_rejected_total{model_name="demo",reason="timeout"}')
used=$(metric 'kiln_kv_pages_used{model_name="demo"}')
[[ "$accepted" == "${SCALE_STREAMS:-300}" && "$completed" == "$accepted" ]] ||
  fail "accounting: accepted $accepted, completed $completed"
[[ "$timeouts" == "${SCALE_SLOW:-200}" ]] || fail "timeouts counted: $timeouts"
[[ "$used" == 0 ]] || fail "KV pages still used: $used"
curl -sf -X POST "$BASE/flush_cache" >/dev/null || fail "/flush_cache"
[[ "$(metric 'kiln_kv_pages_free{model_name="demo"}')" == "$(metric 'kiln_kv_pages_total{model_name="demo"}')" ]] ||
  fail "KV pages not all free after /flush_cache"
stop_server
echo "PASS test_scale ($(grep 'stopped. accepted' "$SERVER_LOG" | sed 's/^kiln serve: //'))"
