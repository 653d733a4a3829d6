#!/usr/bin/env bash
# The main job on the embedded default: install, build, write the demo checkpoint (random weights, real Qwen3
# tokenizer), start `kiln serve` on it and print how to query it. Ctrl-C drains and stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/kiln-ccache}"
cmake --preset release >/dev/null
# Only the binary it runs: the test suite is `bash scripts/test.sh`.
cmake --build --preset release --target kiln
exec bash scripts/serve_demo.sh "$@"
