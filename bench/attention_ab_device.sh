#!/usr/bin/env bash
# A/B of attention variants in one GPU-machine call (device tool, .deps/sysroot carried). Builds
# test_cuda_attention and kiln; runs the attention tests under the defaults, then TEST_AB's tests again under
# each VARIANTS entry; benchmarks the current kernels' rows (decode v3, prefill v4) under the defaults and
# under each VARIANTS entry; optionally ("ncu") the warp-stall breakdown of prefill v4 (bf16, 4096 tokens)
# under the defaults and each variant. A variant is a set of environment assignments, variants separated by
# ';' (e.g. VARIANTS="KILN_ATTN_V4_SERIAL=1;KILN_ATTN_BENCH_SPLITS=1"). Logs go to $OUT (at most 8 files
# come back: keep VARIANTS short); a table of every bench row is printed last.
# "sass": the v4 head_dim-128 unit's SASS into $OUT. BENCH_FILTER: the benchmarks (default "=attention").
# Usage: VARIANTS=... [TEST_AB=gtest-filter] bench/attention_ab_device.sh [tests] [bench] [ncu] [sass]
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
IFS=';' read -r -a variants <<<"${VARIANTS:-}"
summary=()
tests_log="$out/tests.log"
: >"$tests_log"
run_tests() {  # $1: label, $2: gtest filter, rest: env assignments
  local label=$1 filter=$2
  shift 2
  echo "==== tests [$label] $*" >>"$tests_log"
  env "$@" timeout 300 $bd/tests/test_cuda_attention --gtest_brief=1 ${filter:+--gtest_filter=$filter} \
    >>"$tests_log" 2>&1
  summary+=("tests [$label] rc=$? ($(($(date +%s) - t0)) s)")
}
if [[ $want == *" tests "* ]]; then
  run_tests default "${ATTN_FILTER:-}"
  for v in "${variants[@]}"; do
    # shellcheck disable=SC2086
    run_tests "$v" "${TEST_AB:-*PrefillV4*:*DecodeAndPrefill*:*MixedBatch*:*LargeBatch*}" $v
  done
fi
bench_log="$out/bench.log"
: >"$bench_log"
kernels=${BENCH_KERNELS:-decode v3,prefill v4}
if [[ $want == *" bench "* ]]; then
  for v in default "${variants[@]}"; do
    echo "==== bench [$v]" >>"$bench_log"
    a=()
    [[ $v == default ]] || read -r -a a <<<"$v"
    env "${a[@]}" KILN_ATTN_BENCH_KERNELS="$kernels" timeout 200 $bd/bin/kiln bench kernels --filter "${BENCH_FILTER:-=attention}" \
      >>"$bench_log" 2>&1
    summary+=("bench [$v] rc=$? ($(($(date +%s) - t0)) s)")
  done
fi
if [[ $want == *" ncu "* ]]; then
  metrics="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.per_cycle_active,gpu__time_duration.sum"
  for v in default "${variants[@]}"; do
    a=()
    [[ $v == default ]] || read -r -a a <<<"$v"
    echo "==== ncu prefill v4 [$v]" >>"$out/ncu.log"
    env "${a[@]}" KILN_ATTN_BENCH_KERNELS="prefill v4" \
      KILN_ATTN_BENCH_ONLY="ctx=4096 q_len=4096 table=5120 32/8 D128 page32 HND bf16" timeout 120 \
      ncu --clock-control none -k regex:prefill_v4_kernel --launch-skip 3 -c 1 --metrics "$metrics" \
      --section SourceCounters --section WarpStateStats \
      $bd/bin/kiln bench kernels --filter attention >>"$out/ncu.log" 2>&1
    summary+=("ncu [$v] rc=$? ($(($(date +%s) - t0)) s)")
  done
fi
if [[ $want == *" sass "* ]]; then  # the v4 head_dim-128 unit's SASS, to read here
  cuobjdump -sass "$(find $bd -name 'attention_prefill_v4_d128.cu.o' | head -1)" >"$out/sass_v4_d128.txt" 2>&1
  summary+=("sass rc=$? $(grep -c HGMMA "$out/sass_v4_d128.txt") HGMMA lines")
fi
echo "---- summary ($(($(date +%s) - t0)) s)"
for s in "${summary[@]}"; do echo "$s"; done
grep -hE "^\[  (PASSED|FAILED)|^\[  FAILED|^====" "$tests_log" | head -40
grep -hE -B2 -A6 "Failure" "$tests_log" | head -40
grep -E "^====|^\| attention|read stream|^device" "$bench_log" | cut -c1-230
