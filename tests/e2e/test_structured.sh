#!/usr/bin/env bash
# Structured output through the official `openai` npm client: `client.beta.chat.completions.parse()` with a zod
# schema (zodResponseFormat) and with a strict zod tool under tool_choice "required", on `kiln serve` with the
# demo checkpoint (random weights: only the grammar makes the replies parse).
# Usage: test_structured.sh KILN FIXTURES_DIR SRC_DIR
KILN=$1
FIXTURES=$2
SRC=$3
source "$(dirname "$0")/lib.sh"
require_openai_npm
[[ -d "$NODE_PATH/zod" ]] || skip "the zod npm package is missing from .deps/npm"
start_server structured --model "$FIXTURES/demo" --served-model-name demo --max-total-tokens 8192
node "$(dirname "$0")/test_structured.cjs" "$BASE" || fail "openai structured-output checks"
stop_server
echo "PASS test_structured"
