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
tests=(test_cuda_elementwise test_cuda_gemm test_cuda_attention test_cuda_sampling test_cuda_model test_cuda_graph test_model test_model_hf)
t0=$(date +%s)
# Own build dir, no HTTP server (its headers are not needed here): the CUDA tests and `kiln`.
root="$PWD/.deps/sysroot"
export LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bd=build/device-cuda
cmake -S . -B $bd -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_SERVER=OFF \
  -DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu \
  -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
cmake --build $bd -j "$(nproc)" --target "${tests[@]}" kiln >"$out/build.log" 2>&1 ||
  { grep -B2 -A12 -m3 "FAILED\|error" "$out/build.log"; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
export KILN_TUNE_CACHE="$out/gemm_tactics.txt"
summary=()
if [[ $what == tests || $what == all ]]; then
  for t in "${tests[@]}"; do
    $bd/tests/$t --gtest_brief=1 >/tmp/$t.log 2>&1
    rc=$?
    cat /tmp/$t.log >>"$out/tests.log"
    summary+=("$t rc=$rc $(grep -E '^\[  (PASSED|FAILED)' /tmp/$t.log | tr '\n' ' ')")
  done
fi
if [[ $what == bench || $what == all ]]; then
  k=$bd/bin/kiln
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
grep -hE -A3 "Failure" "$out/tests.log" 2>/dev/null | head -40
grep -E "^cuda |^kiln: tuning" "$out/tests.log" | head -6
grep -vE "^tune M" "$out/bench_model.log" 2>/dev/null | grep -v "^$" | head -80
