#!/usr/bin/env bash
# kiln serve driven by the official `openai` npm client (node): chat (streaming and not), completions,
# logprobs, stop strings, error classes, /v1/embeddings on the embedding fixture, and /v1/responses
# (client.responses: test_responses.cjs).
# Usage: test_openai.sh KILN FIXTURES_DIR SRC_DIR
KILN=$1
FIXTURES=$2
SRC=$3
source "$(dirname "$0")/lib.sh"
require_openai_npm

start_server openai_embed --model "$FIXTURES/embed" --served-model-name embed --max-total-tokens 2048
EMB_BASE=$BASE
EMB_PID=$SERVER_PID
EMB_LOG=$SERVER_LOG
start_server openai --model "$FIXTURES/demo" --served-model-name demo --api-key sk-e2e --max-total-tokens 4096
node "$(dirname "$0")/test_openai.cjs" "$BASE" "$EMB_BASE" sk-e2e || fail "openai client checks"
stop_server
start_server responses --model "$FIXTURES/demo" --served-model-name demo --max-total-tokens 4096
node "$(dirname "$0")/test_responses.cjs" demo "$BASE" || fail "openai responses checks"
run_ai_sdk demo "$BASE"
stop_server
SERVER_PID=$EMB_PID
SERVER_LOG=$EMB_LOG
stop_server
echo "PASS test_openai"
