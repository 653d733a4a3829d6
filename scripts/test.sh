#!/usr/bin/env bash
# The test command: install what is missing, build (CUDA compiled where nvcc exists), run every test.
# GPU tests skip, and say so, where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/kiln-ccache}"
cmake --preset ci
cmake --build --preset ci
ctest --preset ci
