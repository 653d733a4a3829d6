#!/usr/bin/env bash
# Short benches in priority order; each runs only if the call has time left (left() from mid.sh's budget).
set -u
B=build/device; K=$B/bin/kiln
left() { echo $(( ${BUDGET:-585} - ($(date +%s) - ${CALL_T0}) )); }
step() { # seconds-needed label cmd...
  local need=$1 label=$2; shift 2
  if (( $(left) < need )); then echo "## SKIP $label (left $(left) s)"; return; fi
  echo "## $label (left $(left) s)"; timeout $(( $(left) - 5 )) bash -c "$*" 2>&1 | grep -v '^kiln: ' | tail -40
}
step 40 "fp8 gemv 4B gate_up M=1" "KILN_GEMM_BENCH_ONLY='4B gate_up M=1' $K bench kernels --filter =gemv_fp8 | grep -E '^\\| gemv'"
step 40 "fp8 gemv 4B qkv M=1" "KILN_GEMM_BENCH_ONLY='4B qkv M=1' $K bench kernels --filter =gemv_fp8 | grep -E '^\\| gemv'"
step 40 "moe router/experts" "$K bench kernels --filter moe | grep -E 'router|T = 1 |T=1 |fused' | head -30"
step 40 "gemm 4B down M=4" "KILN_GEMM_BENCH_ONLY='4B down M=4 ' $K bench kernels --filter =gemm | grep '^| gemm'"
step 40 "gemm 4B qkv M=1" "KILN_GEMM_BENCH_ONLY='4B qkv M=1 ' $K bench kernels --filter =gemm | grep '^| gemm'"
