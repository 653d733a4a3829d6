#!/usr/bin/env bash
# Bounded load: 200 requests at concurrency 32 through the openai client (streaming and not, chat and
# completions, some aborted mid-stream or mid-wait, some invalid), then /metrics must show every request
# accounted for and, after /flush_cache, every KV page free. Usage: test_load.sh KILN FIXTURES_DIR SRC_DIR
KILN=$1
FIXTURES=$2
SRC=$3
source "$(dirname "$0")/lib.sh"
require_openai_npm
start_server load --model "$FIXTURES/demo" --served-model-name demo --max-total-tokens 8192 --page-size 16 \
  --max-running-requests 16 --chunked-prefill-size 256
node "$(dirname "$0")/test_load.cjs" "$BASE" "${LOAD_REQUESTS:-200}" "${LOAD_CONCURRENCY:-32}" || fail "load test"
stop_server
echo "PASS test_load ($(grep 'stopped. accepted' "$SERVER_LOG" | sed 's/^kiln serve: //'))"
