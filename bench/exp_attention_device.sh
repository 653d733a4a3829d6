#!/usr/bin/env bash
# Session-6 experiment on the GPU machine: prefill v4 with and without the consumer ping-pong (tests + bench
# rows), and decode v3 built with KILN_DECODE_V3_STAGES=2 (3 blocks per SM) against the default (3 stages, 2
# blocks per SM). Usage: OUT=DIR bench/exp_attention_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
bash scripts/device_build.sh test_cuda_attention kiln >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
bd=build/device
timeout 300 $bd/tests/test_cuda_attention --gtest_brief=1 >"$out/test_cuda_attention.log" 2>&1
echo "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$out/test_cuda_attention.log" | tr '\n' ' ')"
grep -B2 -A8 "Failure" "$out/test_cuda_attention.log" | head -30
for pp in 1 0; do
  KILN_ATTN_V4_PINGPONG=$pp KILN_ATTN_BENCH_ONLY="q_len=" timeout 120 $bd/bin/kiln bench kernels --filter attention \
    2>&1 | grep -E "prefill v4" | sed "s/^/pingpong=$pp /" | cut -c1-230
done
root="$PWD/.deps/sysroot"
export LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cmake -S . -B build/device2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_SERVER=ON \
  -DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu \
  -DCMAKE_CUDA_FLAGS=-DKILN_DECODE_V3_STAGES=${STAGES:-2} >"$out/build2.log" 2>&1 &&
  cmake --build build/device2 -j "$(nproc)" --target kiln >>"$out/build2.log" 2>&1 || { tail -20 "$out/build2.log"; exit 1; }
for b in device device2; do
  cuobjdump -res-usage build/$b/bin/kiln 2>/dev/null | grep -A1 "decode_kernel_v3" | grep -oE "REG:[0-9]+|SHARED:[0-9]+" | sort | uniq -c | tr '\n' ' '
  echo " <- $b registers"
  for shape in "ctx=9216" "ctx=1024" "ctx=8192"; do
    KILN_ATTN_BENCH_ONLY="$shape" timeout 120 build/$b/bin/kiln bench kernels --filter attention 2>&1 |
      grep -E "decode v3" | sed "s/^/$b /" | cut -c1-200
  done
done
