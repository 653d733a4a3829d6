#!/usr/bin/env bash
# A shortened H200 serving sweep that fits a few minutes of device time: Qwen3-4B shape, random bf16 weights,
# kiln serve on CUDA, kiln bench serve through /generate. Usage (GPU machine): bench/h200_sweep_quick.sh OUT_DIR
# Counts are far below docs/BENCH.md's defaults; say so next to any number taken with this script.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?out dir}
export PATH=/usr/local/cuda/bin:$PATH
bash scripts/device_build.sh kiln 2>&1 | tail -2
K=build/device/bin/kiln
m=/tmp/kiln-qwen3-4b-shape
$K demo-model $m >/dev/null
python3 - "$m/config.json" <<'PY'
import json, sys
p = sys.argv[1]; c = json.load(open(p))
c.update(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
         intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960)
json.dump(c, open(p, "w"), indent=2)
PY
$K serve --model $m --load-format random --device cuda --port 8123 --served-model-name qwen3-4b-shape \
  --max-running-requests 128 >$out/serve.out 2>$out/serve.log &
pid=$!
for _ in $(seq 1 900); do grep -q '^READY ' $out/serve.out 2>/dev/null && break; kill -0 $pid || break; sleep 0.1; done
grep '^READY ' $out/serve.out || { tail -20 $out/serve.log; exit 1; }
timeout ${SWEEP_SECONDS:-110} $K bench serve --base-url http://127.0.0.1:8123 --input-len ${IN:-8192} \
  --output-len ${OUTLEN:-1024} --concurrency ${CONC:-1,8,32} --num-prompts ${NUM:-2,8,32} --warmups 2 \
  --out $out/sweep --no-progress 2>&1 | tail -30
curl -s http://127.0.0.1:8123/metrics | grep -E "^kiln_(requests|kv|num)" | head -20
kill -TERM $pid; wait $pid; tail -3 $out/serve.log
