#!/usr/bin/env bash
# Issue 11 (the decode step) in at most two GPU-machine calls (the device tool, .deps/sysroot carried):
#   bash bench/decode_device.sh tests   build; the fused-kernel, GEMV, attn_prep, graph and model tests; the
#                                       Qwen3-4B-shaped HF checkpoint generated meanwhile and its parity test;
#                                       the 4B batch-1 TPOT with and without the QKV + attn_prep fusion
#   bash bench/decode_device.sh bench   build; the whole-model figures of the issue (fused and not, the
#                                       add + RMSNorm epilogue on), the kernel rows, an ncu of the GEMVs
# Logs go to $OUT (at most 8 files); a summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-tests}
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
export KILN_TUNE_CACHE=/tmp/kiln-gemm-tactics.txt
t0=$(date +%s)
el() { echo "$(($(date +%s) - t0)) s"; }
say() { echo "$*"; }  # progress lines: a call cut off at its limit still shows them
if [[ $what == tests ]]; then
  python3 tests/fixtures/make_hf_4b_reference.py --out /tmp/hf4b >"$out/make_hf4b.log" 2>&1 &
  pid4b=$!
fi
tests=(test_gemv_attn_prep test_cuda_gemv test_attn_prep test_cuda_graph test_cuda_model test_cuda_model_hf4b)
bash scripts/device_build.sh kiln "${tests[@]}" >"$out/build.log" 2>&1 ||
  { grep -B2 -A12 -m3 "FAILED\|error" "$out/build.log"; exit 1; }
say "build: $(el)"
bd=build/device
k=$bd/bin/kiln
# Decode buckets only (M <= 16), so the model load does not tune the prefill shapes.
$k tune --shape qwen3-4b --max-tokens 16 --max-logit-rows 8 >"$out/tune.log" 2>&1
$k tune --shape qwen3-0.6b --max-tokens 16 --max-logit-rows 8 >>"$out/tune.log" 2>&1
$k tune --shape qwen3-4b --show >>"$out/tune.log" 2>&1
say "tune: $(el)"
if [[ $what == tests ]]; then
  for t in test_gemv_attn_prep test_cuda_gemv test_attn_prep test_cuda_graph test_cuda_model; do
    # The whole-model tests with the fusion switched on (it is off by default).
    KILN_GEMV_ATTN_PREP=1 KILN_ATTN_PREP_CASES=400 timeout 120 $bd/tests/$t --gtest_brief=1 >>"$out/tests.log" 2>&1
    rc=$?
    say "$t rc=$rc ($(el)) $(grep -E '^\[  (PASSED|FAILED)' "$out/tests.log" | tail -1)"
  done
  # The add + RMSNorm epilogue without its register cap too (the default run above has it).
  KILN_GEMV_TAIL_MIN_BLOCKS=0 timeout 60 $bd/tests/test_cuda_gemv --gtest_brief=1 --gtest_filter='CudaGemvAddRmsNorm.*' \
    >>"$out/tests.log" 2>&1
  say "test_cuda_gemv (AddRmsNorm, cap 0) rc=$? ($(el))"
  grep -E "FAILED|Failure" "$out/tests.log" | head -8
  timeout 60 $k bench kernels --filter gemv_attn_prep >"$out/kernels.log" 2>&1
  say "bench kernels rc=$? ($(el))"
  grep -E "M=1 .*(tc w(4|8|16)|op )" "$out/kernels.log" | head -30
  wait $pid4b
  say "make_hf_4b rc=$? ($(el)): $(tail -1 "$out/make_hf4b.log")"
  KILN_GEMV_ATTN_PREP=1 KILN_HF4B_DIR=/tmp/hf4b timeout 150 $bd/tests/test_cuda_model_hf4b >"$out/hf4b.log" 2>&1
  say "test_cuda_model_hf4b rc=$? ($(el)): $(grep -E "^\[  (PASSED|FAILED)|greedy" "$out/hf4b.log" | tail -6 | tr '\n' ' ')"
  {
    echo "== 4B ctx 1024 B=1, KILN_GEMV_ATTN_PREP=1, breakdown"
    KILN_GEMV_ATTN_PREP=1 timeout 60 $k bench model --shape qwen3-4b --context 1024 --steps 32
    echo "== 4B ctx 1024 B=1, KILN_GEMV_ATTN_PREP=0 (the default)"
    KILN_GEMV_ATTN_PREP=0 timeout 40 $k bench model --shape qwen3-4b --context 1024 --steps 32 --no-breakdown
  } >"$out/bench.log" 2>&1
  say "bench 4B: $(el)"
else
  {
    for v in "1 0 3" "0 0 3" "1 1 3" "1 1 0"; do
      read -r ap arn cap <<<"$v"
      echo "== 4B ctx 1024 B=1,8 KILN_GEMV_ATTN_PREP=$ap KILN_GEMV_ADD_RMS_NORM=$arn KILN_GEMV_TAIL_MIN_BLOCKS=$cap"
      KILN_GEMV_ATTN_PREP=$ap KILN_GEMV_ADD_RMS_NORM=$arn KILN_GEMV_TAIL_MIN_BLOCKS=$cap timeout 50 $k bench model \
        --shape qwen3-4b --context 1024 --steps 32 --batch 8 $([[ $v == "1 0 3" ]] || echo --no-breakdown)
    done
    for ap in 1 0; do
      echo "== 4B ctx 8192 B=1 KILN_GEMV_ATTN_PREP=$ap"
      KILN_GEMV_ATTN_PREP=$ap timeout 40 $k bench model --shape qwen3-4b --context 8192 --steps 16 --no-breakdown
      echo "== 0.6B ctx 1024 B=1 KILN_GEMV_ATTN_PREP=$ap"
      KILN_GEMV_ATTN_PREP=$ap timeout 30 $k bench model --shape qwen3-0.6b --context 1024 --steps 64 \
        $([[ $ap == 1 ]] || echo --no-breakdown)
    done
  } >"$out/bench.log" 2>&1
  say "bench model: $(el)"
  # The tails' cost inside the GEMV: the O-shaped GEMV with the add + RMSNorm epilogue, capped and not.
  KILN_GEMV_ADD_RMS_NORM=1 timeout 60 ncu --clock-control none --kernel-name regex:"gemv" --launch-skip 300 \
    --launch-count 6 --section SpeedOfLight --section LaunchStats --section Occupancy \
    $k bench model --shape qwen3-4b --context 256 --steps 2 --no-breakdown >"$out/ncu.log" 2>&1
  say "ncu rc=$? ($(el))"
fi
grep -E "TPOT|step|floor|^== |^  [a-z_].* [0-9]" "$out/bench.log" | head -70
