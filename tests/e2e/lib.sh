# Shared helpers for the e2e scripts (sourced). KILN, FIXTURES, SRC come from the caller's arguments.
set -euo pipefail

E2E_LOG_DIR="${E2E_LOG_DIR:-$(mktemp -d /tmp/kiln-e2e.XXXXXX)}"
SERVER_PID=""
PORT=""

fail() {
  echo "FAIL: $*" >&2
  if [[ -n "${SERVER_LOG:-}" && -f "$SERVER_LOG" ]]; then echo "--- server log:" >&2; tail -20 "$SERVER_LOG" >&2; fi
  exit 1
}
skip() {
  echo "SKIP: $*"
  exit 77
}

# require_openai_npm: node and the openai npm package from .deps/npm (SRC: the source tree), else skip.
require_openai_npm() {
  command -v node >/dev/null || skip "node is not installed (scripts/bootstrap.sh installs it)"
  export NODE_PATH="$SRC/.deps/npm/node_modules"
  [[ -d "$NODE_PATH/openai" ]] || skip "the openai npm package is missing from .deps/npm (run scripts/bootstrap.sh)"
}

# run_ai_sdk MODE BASE: tests/e2e/test_ai_sdk.cjs when the AI SDK is in .deps/npm (bootstrap installs it),
# else a note that its checks were left out.
run_ai_sdk() {
  if [[ -f "$NODE_PATH/ai/package.json" && -f "$NODE_PATH/@ai-sdk/openai/package.json" ]]; then
    node "$SRC/tests/e2e/test_ai_sdk.cjs" "$1" "$2" || fail "AI SDK checks ($1)"
  else
    echo "note: the AI SDK (ai, @ai-sdk/openai) is missing from .deps/npm (run scripts/bootstrap.sh): its checks left out"
  fi
}

# start_server NAME ARGS...: kiln serve on a free loopback port (--port 0, the server prints READY).
start_server() {
  local name=$1
  shift
  SERVER_LOG="$E2E_LOG_DIR/$name.log"
  local out="$E2E_LOG_DIR/$name.out"
  "$KILN" serve --port 0 --device cpu "$@" >"$out" 2>"$SERVER_LOG" &
  SERVER_PID=$!
  for _ in $(seq 1 600); do
    if grep -q '^READY ' "$out" 2>/dev/null; then
      PORT=$(sed -n 's/^READY http:\/\/[^:]*:\([0-9]*\)$/\1/p' "$out")
      BASE="http://127.0.0.1:$PORT"
      return 0
    fi
    kill -0 "$SERVER_PID" 2>/dev/null || fail "server '$name' exited before it was ready"
    sleep 0.1
  done
  fail "server '$name' not ready after 60 s"
}

# stop_server: SIGTERM, expect a clean exit (status 0) within 30 s and the accounting line.
stop_server() {
  [[ -n "$SERVER_PID" ]] || return 0
  kill -TERM "$SERVER_PID"
  local rc=0
  wait "$SERVER_PID" || rc=$?
  SERVER_PID=""
  [[ $rc -eq 0 ]] || fail "server exited with status $rc after SIGTERM"
  grep -q 'kiln serve: stopped. accepted' "$SERVER_LOG" || fail "no final accounting line in the server log"
}

cleanup_server() {
  if [[ -n "$SERVER_PID" ]]; then kill -KILL "$SERVER_PID" 2>/dev/null || true; fi
}
trap cleanup_server EXIT

# metric NAME_WITH_LABELS: the value of one Prometheus sample from /metrics (labels as printed).
metric() {
  curl -sf "$BASE/metrics" | awk -v k="$1" 'index($0, k" ") == 1 { print $2 }'
}
