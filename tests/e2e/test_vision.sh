#!/usr/bin/env bash
# Images through the official `openai` npm client: kiln serve on the CPU demo Qwen3-VL checkpoint
# (demo-model --arch vl, random weights), data: URL image parts; checks token counts, determinism and that
# different images change the output distribution.
# Usage: test_vision.sh KILN FIXTURES_DIR SRC_DIR
KILN=$1
FIXTURES=$2
SRC=$3
source "$(dirname "$0")/lib.sh"
require_openai_npm

VL="$E2E_LOG_DIR/vl"
"$KILN" demo-model "$VL" --arch vl >/dev/null || fail "demo-model --arch vl"
start_server vision --model "$VL" --served-model-name demo-vl --max-total-tokens 4096
node "$(dirname "$0")/test_vision.cjs" "$BASE" "$SRC/tests/fixtures/vision/images" || fail "openai image checks"
stop_server
echo "PASS test_vision"
