#!/usr/bin/env bash
# Prefill v4 (Hopper wgmma kernel) in one GPU-machine call (device tool, .deps/sysroot carried): builds
# test_cuda_attention, test_cuda_wgmma and kiln with scripts/device_build.sh (build/device), checks the SASS
# of the v4 units (HGMMA, UTMALDG, USETMAXREG present), runs the wgmma layout tests, the v4 smoke test in
# debug mode (what ran, first mismatch, a few values; if it fails, again with KILN_ATTN_V4_SERIAL=1 and with
# KILN_ATTN_V4_NO_TMA=1 to tell a pipelining or TMA fault from an MMA layout one), the prefill attention
# tests, the attention kernel benchmark, then compute-sanitizer memcheck, racecheck and synccheck on the
# smoke test. The logs are written to a folder of their own and packed into $OUT/prefill_v4_logs.tgz (the
# device tool brings back at most 8 files), beside $OUT/summary.txt, the summary also printed last.
# Usage: bench/prefill_v4_device.sh [steps]   steps: any of build sass smoke failing test bench sanitize
# (default: all but failing). failing: only the tests that failed on the first H200 run (v4's gathered last
# tile after TMA tiles: DecodeAndPrefillAgreeWithinOneUlp, PrefillV4OddLengthsBatch19, LargeBatchMixedLengths)
# plus PrefillV4ManyTilesPartialLast and the smoke test, about a minute; e.g. `bench/prefill_v4_device.sh build
# failing`.
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${OUT:-/tmp/kiln-out}
out=$(mktemp -d /tmp/prefill_v4_logs.XXXXXX)
mkdir -p "$dest"
export PATH=/usr/local/cuda/bin:$PATH
steps=" ${*:-build sass smoke test bench sanitize} "
t0=$(date +%s)
bd=${BD:-build/device}  # BD: another build folder (a local dry run)
T=$bd/tests/test_cuda_attention
summary=()
step() { [[ $steps == *" $1 "* ]]; }
elapsed() { echo "$(($(date +%s) - t0)) s"; }

if step build; then
  bash scripts/device_build.sh test_cuda_attention test_cuda_wgmma kiln >"$out/build.log" 2>&1 ||
    { grep -B2 -A12 -m5 "FAILED\|error" "$out/build.log" | tee "$dest/summary.txt"; echo "BUILD FAILED ($(elapsed))";
      cp "$out/build.log" "$dest/"; exit 1; }
  summary+=("build: ok at $(elapsed)")
fi

if step sass; then
  {
    for d in 64 128; do
      o=$(find $bd -name "attention_prefill_v4_d$d.cu.o" | head -1)
      [[ -n $o ]] || { echo "d$d: object not found"; continue; }
      cuobjdump --dump-sass "$o" >"$out/sass_d$d.txt" 2>&1
      echo "d$d: HGMMA $(grep -c HGMMA "$out/sass_d$d.txt"), UTMALDG $(grep -c UTMALDG "$out/sass_d$d.txt")," \
        "USETMAXREG $(grep -c USETMAXREG "$out/sass_d$d.txt"), WARPSYNC/ARRIVES $(grep -cE 'SYNCS' "$out/sass_d$d.txt")"
      cuobjdump --dump-resource-usage "$o" 2>&1 | grep -E "Function|REG|SHARED" | head -8
    done
  } >"$out/sass_summary.txt" 2>&1
  summary+=("sass: $(grep -E '^d(64|128):' "$out/sass_summary.txt" | tr '\n' ' ')")
fi

if step smoke; then
  timeout 30 $bd/tests/test_cuda_wgmma >"$out/wgmma.log" 2>&1
  summary+=("wgmma layout tests: rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$out/wgmma.log" | tr '\n' ' ')")
  KILN_ATTN_TEST_DEBUG=1 timeout 60 $T --gtest_filter='CudaAttention.PrefillV4Smoke' >"$out/smoke.log" 2>&1
  rc=$?
  summary+=("smoke (debug): rc=$rc $(grep -cE '^\[v4 debug\] (bf16|fp8)' "$out/smoke.log") cases printed")
  if ((rc != 0)); then
    for var in KILN_ATTN_V4_SERIAL KILN_ATTN_V4_NO_TMA; do
      env $var=1 KILN_ATTN_TEST_DEBUG=1 timeout 60 $T --gtest_filter='CudaAttention.PrefillV4Smoke' \
        >"$out/smoke_$var.log" 2>&1
      summary+=("smoke with $var=1: rc=$?")
    done
  fi
fi

if step failing; then
  ft='CudaAttention.PrefillV4ManyTilesPartialLast:CudaAttention.PrefillV4Smoke:CudaAttention.LargeBatchMixedLengths'
  ft+=':CudaAttention.DecodeAndPrefillAgreeWithinOneUlp:CudaAttention.PrefillV4OddLengthsBatch19'
  timeout 200 $T --gtest_brief=1 --gtest_filter="$ft" >"$out/failing.log" 2>&1
  rc=$?
  summary+=("previously failing tests: rc=$rc at $(elapsed): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test|^\[  FAILED  \] CudaAttention' "$out/failing.log" | head -12 | tr '\n' ' ')")
  # The new test again with every tile gathered (no TMA): tells a remaining pipelining fault from a TMA one.
  KILN_ATTN_V4_NO_TMA=1 timeout 60 $T --gtest_brief=1 --gtest_filter='CudaAttention.PrefillV4ManyTilesPartialLast' \
    >"$out/failing_no_tma.log" 2>&1
  summary+=("PrefillV4ManyTilesPartialLast with KILN_ATTN_V4_NO_TMA=1: rc=$?")
fi

if step test; then
  timeout 170 $T --gtest_brief=1 \
    --gtest_filter='CudaAttention.PrefillV4*:CudaAttention.MixedBatch*:CudaAttention.NhdAndHnd*:CudaAttention.MatchesCpuOracle:CudaAttention.DecodeAndPrefill*:CudaAttention.PrefillV1V2V3*:CudaAttention.MultiRow*' \
    >"$out/tests.log" 2>&1
  rc=$?
  summary+=("prefill tests: rc=$rc at $(elapsed): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test|^\[  FAILED  \] CudaAttention' "$out/tests.log" | head -12 | tr '\n' ' ')")
fi

if step bench; then
  { nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
    timeout 120 $bd/bin/kiln bench kernels --filter attention --reps 30; } >"$out/bench.log" 2>&1
  summary+=("bench: rc=$? at $(elapsed)")
fi

if step sanitize; then
  for tool in memcheck racecheck synccheck; do
    timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter='CudaAttention.PrefillV4Smoke' \
      >"$out/san_$tool.log" 2>&1
    summary+=("compute-sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/san_$tool.log" | tr '\n' ' ')")
  done
fi

{
echo "---- summary ($(elapsed))"
for s in "${summary[@]}"; do echo "$s"; done
grep -h "^\[wgmma" "$out/wgmma.log" 2>/dev/null | head -16
grep -h "^\[v4 debug\]" "$out/smoke.log" 2>/dev/null | head -24
for f in "$out"/smoke_KILN_*.log; do [[ -f $f ]] && { echo "== $f"; grep -h "^\[v4 debug\] [bf]" "$f" | head -4; }; done
grep -hE -A6 "Failure" "$out/smoke.log" "$out/failing.log" "$out/failing_no_tma.log" "$out/tests.log" 2>/dev/null | head -40
grep -E "prefill" "$out/bench.log" 2>/dev/null | cut -c1-220
grep -hE -m6 "Invalid|Race|Error|Barrier" "$out"/san_*.log 2>/dev/null | head -12
} 2>&1 | tee "$dest/summary.txt"
tar czf "$dest/prefill_v4_logs.tgz" -C "$out" .
