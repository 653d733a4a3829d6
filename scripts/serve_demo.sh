#!/usr/bin/env bash
# Starts `kiln serve` on the demo checkpoint (random weights, real Qwen3 tokenizer), shows how to query it
# with one real request, then serves until Ctrl-C (which drains in-flight requests and exits cleanly).
#   scripts/serve_demo.sh [--check]     --check: run the sample queries, then stop the server and exit
# Environment: KILN (binary, default build/release/bin/kiln), MODEL (default build/demo-model, written
# if missing), HOST (127.0.0.1), PORT (8000), DEVICE (cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
KILN=${KILN:-build/release/bin/kiln}
MODEL=${MODEL:-build/demo-model}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
DEVICE=${DEVICE:-cpu}
CHECK=0
[[ "${1:-}" == "--check" ]] && CHECK=1

[[ -x "$KILN" ]] || { echo "serve_demo: $KILN not found; build first (cmake --preset release && cmake --build --preset release --target kiln)" >&2; exit 1; }
[[ -f "$MODEL/config.json" ]] || "$KILN" demo-model "$MODEL"

LOG=$(mktemp /tmp/kiln-serve.XXXXXX.log)
"$KILN" serve --model "$MODEL" --served-model-name demo --host "$HOST" --port "$PORT" --device "$DEVICE" \
  --max-total-tokens 16384 >"$LOG.out" 2>"$LOG" &
PID=$!
trap 'kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null || true' INT TERM
for _ in $(seq 1 600); do
  grep -q '^READY ' "$LOG.out" 2>/dev/null && break
  kill -0 $PID 2>/dev/null || { cat "$LOG" >&2; exit 1; }
  sleep 0.1
done
grep -q '^READY ' "$LOG.out" || { echo "serve_demo: server not ready after 60 s" >&2; cat "$LOG" >&2; exit 1; }
BASE="http://$HOST:$PORT"

cat <<MSG
kiln is serving the demo checkpoint at $BASE (model name "demo"; its weights are random, so the text is
nonsense -- point MODEL at a real Qwen3 checkpoint for real answers). Server log: $LOG

  curl $BASE/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model":"demo","messages":[{"role":"user","content":"Hello!"}],"max_tokens":16}'
  curl -N $BASE/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model":"demo","prompt":"The capital of France is","max_tokens":16,"stream":true}'
  curl $BASE/generate -d '{"text":"Once upon a time","sampling_params":{"max_new_tokens":8}}'
  curl $BASE/v1/models    curl $BASE/health    curl $BASE/metrics

  Python:  OpenAI(base_url="$BASE/v1", api_key="none").chat.completions.create(model="demo", ...)

Sample request (chat, greedy, 12 tokens):
MSG
curl -s "$BASE/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"demo","messages":[{"role":"user","content":"Hello!"}],"max_tokens":12,"temperature":0}'
echo
if ((CHECK)); then
  curl -sf "$BASE/health" >/dev/null
  kill -TERM $PID
  wait $PID
  tail -1 "$LOG"
  exit 0
fi
echo "Serving until Ctrl-C."
wait $PID
