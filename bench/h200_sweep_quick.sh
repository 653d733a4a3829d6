#!/usr/bin/env bash
# A shortened H200 serving sweep that fits a few minutes of device time: Qwen3-4B shape, random bf16 weights,
# kiln serve on CUDA, kiln bench serve through /generate. Usage (GPU machine): bench/h200_sweep_quick.sh OUT_DIR
# Env: CONC, NUM (levels and prompts per level), IN, OUTLEN, SWEEP_SECONDS, KV (auto|fp8_e4m3), SERVE_ARGS.
# Counts are far below docs/BENCH.md's defaults; say so next to any number taken with this script.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?out dir}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
bash scripts/device_build.sh kiln 2>&1 | tail -2  # ninja: free when nothing changed
K=build/device/bin/kiln
source bench/serve_lib.sh
m=/tmp/kiln-qwen3-4b-shape
shape_model $m 4b
kv=${KV:-auto}
# shellcheck disable=SC2086
serve_start serve-$kv 8123 --model $m --load-format random --device cuda --served-model-name qwen3-4b-shape \
  --max-running-requests 128 --kv-cache-dtype "$kv" ${SERVE_ARGS:-} || exit 1
grep -h 'KV pool\|captured' "$out/serve-$kv.log" | head -3
timeout ${SWEEP_SECONDS:-110} $K bench serve --base-url http://127.0.0.1:8123 --input-len ${IN:-8192} \
  --output-len ${OUTLEN:-1024} --concurrency ${CONC:-1,8,32} --num-prompts ${NUM:-2,8,32} --warmups 2 \
  --title "Qwen3-4B shape, random bf16 weights, KV $kv, H200" --out $out/sweep-$kv --no-progress 2>&1 | tail -30
curl -s http://127.0.0.1:8123/metrics | grep -E "^kiln_(requests|kv|num|preempt)" | head -24
serve_stop
