#!/usr/bin/env bash
# One GPU-machine session for the CUDA backend (run through the device tool, .deps/sysroot carried):
# builds the CUDA tests and `kiln` with scripts/device_build.sh, runs the GPU tests, tunes the GEMMs of the
# benchmarked shapes, then the whole-model benchmarks. Logs go to $OUT; a summary is printed last.
# Usage: bench/bench_model_device.sh [tests|bench|all]
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
tests=(test_cuda_elementwise test_cuda_gemm test_cuda_attention test_cuda_sampling test_cuda_model)
t0=$(date +%s)
scripts/device_build.sh "${tests[@]}" >"$out/build.log" 2>&1 || { tail -60 "$out/build.log"; exit 1; }
echo "build tests: $(($(date +%s) - t0)) s"
# kiln (every stage) builds in the background while the tests use the GPU.
(scripts/device_build.sh kiln >"$out/build_kiln.log" 2>&1; echo $? >"$out/build_kiln.rc") &
kiln_pid=$!
export LD_LIBRARY_PATH="$PWD/.deps/sysroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KILN_TUNE_CACHE="$out/gemm_tactics.txt"
summary=()
if [[ $what == tests || $what == all ]]; then
  for t in "${tests[@]}"; do
    build/device/tests/$t --gtest_brief=1 >"$out/$t.log" 2>&1
    rc=$?
    summary+=("$t rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$out/$t.log" | tr '\n' ' ')")
  done
fi
if [[ $what == bench || $what == all ]]; then
  wait $kiln_pid
  [[ $(cat "$out/build_kiln.rc") == 0 ]] || { echo "kiln build failed"; tail -40 "$out/build_kiln.log"; }
  echo "kiln built at $(($(date +%s) - t0)) s"
  k=build/device/bin/kiln
  {
    $k tune --shape qwen3-4b --max-tokens 4096 --max-logit-rows 1 && $k tune --shape qwen3-4b --show | tail -3
    $k tune --shape qwen3-0.6b --max-tokens 16 --max-logit-rows 1 | tail -2
    $k bench model --shape qwen3-4b --context 1024 --steps 32 --prefill 4096
    $k bench model --shape qwen3-4b --context 8192 --steps 16 --no-breakdown
    $k bench model --shape qwen3-0.6b --context 1024 --steps 64
  } >"$out/bench_model.log" 2>&1
  summary+=("bench rc=$?")
fi
echo "---- summary ($(($(date +%s) - t0)) s)"
for s in "${summary[@]}"; do echo "$s"; done
grep -hE "^\[  FAILED  \]|Failure|error" "$out"/test_*.log 2>/dev/null | head -40
grep -E "device|prefill|TPOT|total" "$out/bench_model.log" 2>/dev/null
