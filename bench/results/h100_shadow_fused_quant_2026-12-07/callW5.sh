#!/usr/bin/env bash
# kiln + test_cuda_fp8_act_producers of .carry/commitW5 (built here): the fused producers' default threshold (M >= 1024):
# the test, then the 4B FP8 8192-token prompt and the batch-32 decode step, default vs KILN_FP8_FUSED_ACT_QUANT=0.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
mv .carry/rtmid.tgz .carry/rtlibs.tgz; mv .carry/pbW5.tar.xz .carry/prebuilt.tar.xz; source scripts/device_prebuilt.sh unpack
S=$OUT/w5_summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $S
timeout 120 build/release/tests/test_cuda_fp8_act_producers > $OUT/w5_test.txt 2>&1; echo "test_cuda_fp8_act_producers rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/w5_test.txt | tr '\n' ' ')" | tee -a $S
export KILN_TUNE_CACHE=/tmp/tc_4bfp8_8192
timeout 200 $KILN tune --shape qwen3-4b --quantization fp8 --max-tokens 8192 --max-logit-rows 8 > /dev/null 2>&1; echo "tuned rc=$? $(el) s" | tee -a $S
for r in 1; do for v in default 0; do (( $(el) > 150 )) && break
  e=KILN_X=1; [[ $v == 0 ]] && e=KILN_FP8_FUSED_ACT_QUANT=0
  env $e timeout 60 $KILN bench model --shape qwen3-4b --quantization fp8 --context 2 --steps 1 --prefill 8192 --no-breakdown > /tmp/p.txt 2>&1
  echo "prefill 8192 fused=$v rc=$? $(grep -hE '^prefill' /tmp/p.txt | tail -1 | cut -c1-120)" | tee -a $S
  env $e timeout 60 $KILN bench model --shape qwen3-4b --quantization fp8 --context 1024 --steps 16 --batch 32 --no-breakdown > /tmp/d.txt 2>&1
  echo "decode b32 fused=$v rc=$? $(grep -hE 'CUDA graph \+' /tmp/d.txt | tail -1 | cut -c1-120)" | tee -a $S
  cat /tmp/p.txt /tmp/d.txt >> $OUT/w5_model.txt; done; done
# For the next pass (issue 44, C = 10 / 64): the W8A8 grouped GEMM at 16 tokens a step under ncu (60 % of the copy
# rate in E11): SpeedOfLight, memory, occupancy, warp states.
if (( $(el) < 110 )); then
  NCU_TUNE="qwen3-30b-a3b --quantization fp8" NCU_KERNEL="w8a8_kernel|quantize_rows" NCU_COUNT=6 NCU_SECONDS=100 \
    NCU_CMD="bench model --shape qwen3-30b-a3b --quantization fp8 --prefill 1 --context 2 --steps 1 --batch 16 --no-breakdown" \
    OUT=/tmp/ncuout bash bench/device.sh ncu-cmd > $OUT/w5_ncu_log.txt 2>&1
  echo "ncu rc=$? $(el) s" | tee -a $S
  find /tmp/ncuout -name report.txt -exec cp {} $OUT/w5_ncu_report.txt \; 2>/dev/null
fi
echo "elapsed $(el) s" | tee -a $S
