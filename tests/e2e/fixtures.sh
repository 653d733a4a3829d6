#!/usr/bin/env bash
# Writes the e2e checkpoints: the demo model (generation) and the same decoder saved as an embedding
# model (architectures ["Qwen3Model"]). Usage: fixtures.sh KILN FIXTURES_DIR
set -euo pipefail
KILN=$1
DIR=$2
mkdir -p "$DIR"
"$KILN" demo-model "$DIR/demo" >/dev/null
"$KILN" demo-model "$DIR/embed" --embedding >/dev/null
echo "fixtures in $DIR: demo, embed"
