#!/usr/bin/env bash
# One GPU-machine call for the attention kernels (device tool, .deps/sysroot carried): builds
# test_cuda_attention and kiln, runs the attention tests (every decode / prefill generation), then the
# attention kernel benchmark; optional extras by argument: "sanitize" (compute-sanitizer memcheck, racecheck,
# synccheck on a small filtered test), "ncu" (Nsight Compute on the v3 decode kernel at B=128 ctx 9216).
# Logs go to $OUT; a summary is printed last. Usage: bench/attention_device.sh [tests] [bench] [sanitize] [ncu]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
want=" ${*:-tests bench} "
t0=$(date +%s)
bash scripts/device_build.sh test_cuda_attention kiln >"$out/build.log" 2>&1 ||
  { grep -B2 -A12 -m3 "FAILED\|error" "$out/build.log"; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
bd=build/device
summary=()
if [[ $want == *" tests "* ]]; then
  timeout 400 $bd/tests/test_cuda_attention --gtest_brief=1 ${ATTN_FILTER:+--gtest_filter=$ATTN_FILTER} \
    >"$out/test_cuda_attention.log" 2>&1
  summary+=("test_cuda_attention rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$out/test_cuda_attention.log" | tr '\n' ' ') ($(($(date +%s) - t0)) s)")
fi
if [[ $want == *" bench "* ]]; then
  timeout 300 $bd/bin/kiln bench kernels --filter attention >"$out/bench_attention.log" 2>&1
  summary+=("bench rc=$? ($(($(date +%s) - t0)) s)")
fi
if [[ $want == *" sanitize "* ]]; then
  for tool in memcheck racecheck synccheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 $bd/tests/test_cuda_attention --gtest_brief=1 \
      --gtest_filter="${SAN_FILTER:-CudaAttention.NhdAndHndBitwiseEqual:CudaAttention.MatchesCpuOracle:CudaAttention.Fp8SmallGridForSanitizers}" >"$out/sanitize_$tool.log" 2>&1
    summary+=("sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY' "$out/sanitize_$tool.log" | head -1)")
  done
fi
if [[ $want == *" ncu "* ]]; then
  timeout 200 ncu --clock-control none -k regex:decode_kernel_v3 -c 2 --set full $bd/bin/kiln bench kernels \
    --filter attention >"$out/ncu.log" 2>&1
  summary+=("ncu rc=$?")
fi
echo "---- summary ($(($(date +%s) - t0)) s)"
for s in "${summary[@]}"; do echo "$s"; done
grep -hE -B2 -A6 "Failure|error" "$out/test_cuda_attention.log" 2>/dev/null | head -60
grep -E "^\| attention|^device" "$out/bench_attention.log" 2>/dev/null | cut -c1-260
