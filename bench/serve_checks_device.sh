#!/usr/bin/env bash
# Issue 6's H200 checks on the Qwen3-4B shape (random bf16 weights): greedy outputs of kiln serve with its
# defaults (CUDA graph buckets, mixed prefill/decode batches) against --disable-cuda-graph and against
# --disable-mixed-batches, through `kiln eval reference`: 32 prompts of 10-3000 words, 64 greedy tokens each,
# 16 in flight, so decode batches of many sizes (graph buckets, padding) and mixed steps occur. The dump keeps
# each step's top-2, so the summary says how many divergences are near ties (the other run took the
# reference's runner-up within --tie-margin, 0.05 nats: bf16 rounding on a flat random-weight distribution)
# and how many are not (worth a look).
# Usage (GPU machine): bench/serve_checks_device.sh OUT_DIR
# Env: DEVICE (cuda), SHAPE (4b|0.6b|demo), KILN (binary), PROMPT_SCALE (1; 0.1 for a CPU dry run on the demo),
# KV (kv-cache-dtype, e.g. fp8_e4m3), VARIANTS (see below), MAX_RUNNING (64; below 16, requests wait for a place).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?out dir}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
K=${KILN:-build/device/bin/kiln}
# Always build (ninja makes it free when nothing changed), so no check runs a stale binary; KILN set: as is.
[[ -n ${KILN:-} ]] || bash scripts/device_build.sh kiln 2>&1 | tail -2
source bench/serve_lib.sh
m=/tmp/kiln-qwen3-${SHAPE:-4b}-shape
shape_model $m ${SHAPE:-4b}
python3 - "$out/prompts.txt" ${PROMPT_SCALE:-1} <<'PY'
import random, sys
r = random.Random(7)
scale = float(sys.argv[2])
words = "the of and to in is was for on that with as by at from his an were are which this be or have".split()
with open(sys.argv[1], "w") as f:
    for i in range(32):
        n = int(([10, 40, 200, 800, 3000][i % 5] + r.randrange(10)) * scale) + 1
        f.write(" ".join(r.choice(words) for _ in range(n)) + "\n")
PY
common=(--model $m --load-format random --device ${DEVICE:-cuda} --served-model-name shape --max-running-requests ${MAX_RUNNING:-64}
  ${KV:+--kv-cache-dtype $KV})
eval_args=(--base-url http://127.0.0.1:8124 --concurrency 16 --timeout 600)
summary=()
serve_start defaults 8124 "${common[@]}" || exit 1
$K eval reference "${eval_args[@]}" --write --dump "$out/defaults.json" --prompts "$out/prompts.txt" \
  --max-tokens 64 || exit 1
curl -s http://127.0.0.1:8124/metrics | grep -E "^kiln_(steps|requests_total|preempt)" | head
serve_stop
# VARIANTS: flags of kiln serve (without --), or old-kernels (the previous attention kernels: decode v2,
# prefill v3, through KILN_ATTN_DECODE / KILN_ATTN_PREFILL).
for variant in ${VARIANTS:-disable-cuda-graph disable-mixed-batches}; do
  if [[ $variant == old-kernels ]]; then
    KILN_ATTN_DECODE=v2 KILN_ATTN_PREFILL=v3 serve_start $variant 8124 "${common[@]}" || exit 1
  else
    serve_start $variant 8124 "${common[@]}" --$variant || exit 1
  fi
  $K eval reference "${eval_args[@]}" --dump "$out/defaults.json" --out "$out/$variant.json" \
    >"$out/$variant.txt" 2>&1
  cat "$out/$variant.txt" | head -12
  summary+=("defaults vs $variant: $(grep -E '^prompts' "$out/$variant.txt"); $(grep -E '^log-prob' "$out/$variant.txt"); $(grep -E '^divergences' "$out/$variant.txt")")
  serve_stop
done
printf '%s\n' "${summary[@]}"
