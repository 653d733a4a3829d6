#!/usr/bin/env bash
# Reasoning and tool calling with the official `openai` npm client: kiln's HTTP server and the demo
# checkpoint's tokenizer over a scripted fake engine (tests/e2e/fake_serve.cpp), so the parsers see real
# Qwen3 tags: call -> tool results -> answer, streaming and not.
# Usage: test_tools.sh KILN_FAKE_SERVE FIXTURES_DIR SRC_DIR
KILN=$1
FIXTURES=$2
SRC=$3
source "$(dirname "$0")/lib.sh"
require_openai_npm
start_server tools --model "$FIXTURES/demo"
node "$(dirname "$0")/test_tools.cjs" "$BASE" || fail "openai tool-call checks"
node "$(dirname "$0")/test_responses.cjs" tools "$BASE" || fail "openai responses tool-call checks"
run_ai_sdk tools "$BASE"
stop_server
echo "PASS test_tools"
