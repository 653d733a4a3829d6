#!/usr/bin/env bash
# One GPU-machine call for the CUDA backend (through the device tool, .deps/sysroot carried): builds every
# CUDA test and `kiln` with scripts/device_build.sh (build/device, reused by the serving scripts), runs the
# GPU tests, tunes the GEMMs of the benchmarked shapes, then the whole-model and kernel benchmarks.
# Logs go to $OUT; a summary is printed last. Usage: bench/bench_model_device.sh [tests|bench|all|decode]
# decode: the decode step (issue 11) alone, about 2 minutes: the GPU tests of its kernels and graphs, then
# `kiln bench model` rows (4B ctx 1024 batch 1 and 8 with the per-op breakdown, each op without and with
# PDL; 4B ctx 8192 batch 1 bf16 and fp8; fp8 batch 32 and 128; 0.6B ctx 1024 batch 1 and 8). SITES=1 adds
# the PDL A/B by op family (KILN_PDL_SITES), SERVE=1 serving at C = 1 (8192 in / 1024 out, 4 prompts,
# bench/h200_sweep_quick.sh); about a minute each.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
t0=$(date +%s)
tests=(test_model test_model_hf test_model_vl test_engine_demo)
for f in tests/cuda/test_*.cpp tests/cuda/test_*.cu; do tests+=("$(basename "${f%.*}")"); done
[[ $what == decode ]] && tests=(test_cuda_gemv test_cuda_gemv_add_rms_norm test_cuda_gemv_norm_in
  test_gemv_attn_prep test_attn_prep test_cuda_graph test_cuda_model)
bash scripts/device_build.sh "${tests[@]}" kiln >"$out/build.log" 2>&1 ||
  { grep -B2 -A12 -m3 "FAILED\|error" "$out/build.log"; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
bd=build/device
# One tactic cache for this machine's later calls too (the serving scripts start kiln serve on it).
export KILN_TUNE_CACHE=${KILN_TUNE_CACHE:-/tmp/kiln-gemm-tactics.txt}
summary=()
if [[ $what == tests || $what == all || $what == decode ]]; then
  for t in "${tests[@]}"; do
    timeout 300 $bd/tests/$t --gtest_brief=1 >"$out/$t.log" 2>&1
    rc=$?
    summary+=("$t rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$out/$t.log" | tr '\n' ' ')")
  done
fi
if [[ $what == bench || $what == all ]]; then
  k=$bd/bin/kiln
  {
    $k tune --shape qwen3-4b --max-tokens 4096 --max-logit-rows 128 && $k tune --shape qwen3-4b --show | tail -12
    $k tune --shape qwen3-0.6b --max-tokens 16 --max-logit-rows 1 | tail -2
    $k bench model --shape qwen3-4b --context 1024 --steps 32 --prefill 4096 --batch 8,32,128
    KILN_ATTN_DECODE=v1 $k bench model --shape qwen3-4b --context 1024 --steps 32 --no-breakdown | grep -E "TPOT"
    $k bench model --shape qwen3-4b --context 8192 --steps 16 --no-breakdown
    $k bench model --shape qwen3-0.6b --context 1024 --steps 64
    $k bench kernels --filter attention
    $k bench kernels --filter gemm
  } >"$out/bench_model.log" 2>&1
  summary+=("bench rc=$?")
fi
if [[ $what == decode ]]; then
  k=$bd/bin/kiln
  {
    $k tune --shape qwen3-4b --max-tokens 160 --max-logit-rows 128 >"$out/tune.log" 2>&1
    $k tune --shape qwen3-0.6b --max-tokens 16 --max-logit-rows 1 >>"$out/tune.log" 2>&1
    echo "==== 4B ctx 1024 batch 1, 8 + breakdown"
    $k bench model --shape qwen3-4b --context 1024 --steps 32 --batch 8
    echo "==== 4B ctx 8192 batch 1, bf16 cache"
    $k bench model --shape qwen3-4b --context 8192 --steps 16 --no-breakdown
    echo "==== 4B ctx 8192 batch 1, 32, 128, fp8 cache"
    $k bench model --shape qwen3-4b --kv-dtype fp8 --context 8192 --steps 16 --batch 32,128 --no-breakdown
    echo "==== 0.6B ctx 1024 batch 1, 8"
    $k bench model --shape qwen3-0.6b --context 1024 --steps 64 --batch 8 --no-breakdown
    if [[ ${SITES:-0} == 1 ]]; then
      for v in all gemv attention elementwise,lm_head; do
        [[ $v == all ]] && e=() || e=("KILN_PDL_SITES=$v")
        echo "==== PDL sites $v"
        env "${e[@]}" $k bench model --shape qwen3-4b --context 1024 --steps 32 --no-breakdown
      done
    fi
  } >"$out/bench_model.log" 2>&1
  summary+=("decode bench rc=$?")
  if [[ ${SERVE:-0} == 1 ]]; then
    CONC=1 NUM=4 SWEEP_SECONDS=80 bash bench/h200_sweep_quick.sh "$out/serve_c1" >"$out/serve_c1.log" 2>&1
    summary+=("serving C=1 rc=$? $(grep -E 'C=1:' "$out/serve_c1.log")")
  fi
fi
echo "---- summary ($(($(date +%s) - t0)) s)"
for s in "${summary[@]}"; do echo "$s"; done
grep -hE -B1 -A4 "Failure" "$out"/test_*.log 2>/dev/null | head -40
grep -vE "^tune M" "$out/bench_model.log" 2>/dev/null | grep -v "^$" | head -120
