#!/usr/bin/env bash
# The main job on the embedded default: install, build, write the demo checkpoint, run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cmake --preset release >/dev/null
cmake --build --preset release
./build/release/bin/kiln demo-model build/demo-model
./build/release/bin/kiln generate --model build/demo-model --prompt "The capital of France is" --max-tokens 16
