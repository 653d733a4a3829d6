#!/usr/bin/env bash
# kiln + test_cuda_model_moe + test_cuda_launch (commit in .carry/commitU1 + the launch() fix, built here):
# tests, the 30B-A3B FP8 batch-1 step, each kernel's time in one step with path (d) and path (c) under ncu,
# and the router's stall samples by CUDA line.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
mv .carry/rtmid.tgz .carry/rtlibs.tgz; mv .carry/pbU2.tar.xz .carry/prebuilt.tar.xz; source scripts/device_prebuilt.sh unpack
S=$OUT/u2_summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $S
T=build/release/tests
rt() { local n=$1 lim=$2; shift 2; echo "######## $n $*" >> $OUT/u2_tests.txt
  timeout "$lim" $T/$n "$@" >> $OUT/u2_tests.txt 2>&1; local rc=$?
  echo "$n rc=$rc $(el) s: $(grep -E -c '^\[       OK' $OUT/u2_tests.txt) ok so far; failed: $(grep -E '^\[  FAILED  \] [A-Za-z]' $OUT/u2_tests.txt | sort -u | tr '\n' ' ')" | tee -a $S; }
rt test_cuda_launch 60
rt test_cuda_model_moe 200
export KILN_TUNE_CACHE=/tmp/tc30
$KILN tune --shape qwen3-30b-a3b --quantization fp8 --max-tokens 8 --max-logit-rows 8 > $OUT/u2_tune.txt 2>&1
echo "tune rc=$? $(el) s" | tee -a $S
for v in 1 0 1 0; do
  KILN_MOE_FP8_E4M3X16=$v timeout 120 $KILN bench model --shape qwen3-30b-a3b --quantization fp8 --context 1024 --steps 32 --no-breakdown > /tmp/m$v.txt 2>&1
  echo "x16=$v rc=$? $(grep -hE 'CUDA graph' /tmp/m$v.txt | head -2 | tr '\n' ' ')" | tee -a $S
  cat /tmp/m$v.txt >> $OUT/u2_model.txt
done
for v in 1 0; do
  KILN_MOE_FP8_E4M3X16=$v timeout 150 ncu --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv $KILN bench model --shape qwen3-30b-a3b --quantization fp8 --context 2 --steps 1 \
    --prefill 1 --no-breakdown > /tmp/ncu$v.csv 2>/tmp/ncu$v.err
  echo "ncu x16=$v rc=$? $(el) s" | tee -a $S
  python3 bench/prefill_breakdown.py /tmp/ncu$v.csv 48 > $OUT/u2_breakdown_x16_$v.txt 2>&1
  xz -9 -c /tmp/ncu$v.csv > $OUT/u2_ncu_x16_$v.csv.xz
done
if (( $(el) < 420 )); then
NCU_SOURCE=1 NCU_COUNT=8 NCU_KERNEL=router_route NCU_SECONDS=150 \
  NCU_CMD="bench model --shape qwen3-30b-a3b --quantization fp8 --prefill 1 --context 2 --steps 1 --no-breakdown" \
  OUT=/tmp/ncuout bash bench/device.sh ncu-cmd > /tmp/ncu_log.txt 2>&1
echo "ncu router rc=$? $(el) s" | tee -a $S
cat /tmp/ncuout/ncu-cmd-source-cuda.txt /tmp/ncuout/ncu-cmd-source-sass.txt > $OUT/u2_router_source.txt 2>/dev/null
tail -45 /tmp/ncu_log.txt >> $OUT/u2_router_source.txt
fi
head -30 $OUT/u2_breakdown_x16_1.txt; head -30 $OUT/u2_breakdown_x16_0.txt
echo "all $(el) s" | tee -a $S
