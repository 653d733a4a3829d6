#!/usr/bin/env bash
# kiln of .carry/commitW1: the 4B FP8 prompt of 8192 / 1024 tokens, KILN_FP8_FUSED_ACT_QUANT=0|1 alternating.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
mv .carry/rtmid.tgz .carry/rtlibs.tgz; mv .carry/pbW1.tar.xz .carry/prebuilt.tar.xz; source scripts/device_prebuilt.sh unpack
S=$OUT/w4_summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $S
export KILN_TUNE_CACHE=/tmp/tc_4bfp8_8192
timeout 200 $KILN tune --shape qwen3-4b --quantization fp8 --max-tokens 8192 --max-logit-rows 8 > $OUT/w4_tune.txt 2>&1; echo "tuned rc=$? $(el) s" | tee -a $S
for r in 1 2 3; do for n in 8192 1024; do for v in 0 1; do (( $(el) > 500 )) && break
  KILN_FP8_FUSED_ACT_QUANT=$v timeout 60 $KILN bench model --shape qwen3-4b --quantization fp8 --context 2 --steps 1 --prefill $n --no-breakdown > /tmp/p.txt 2>&1
  echo "prefill $n fused_act_quant=$v rc=$? $(grep -hE '^prefill' /tmp/p.txt | tail -1 | cut -c1-160)" | tee -a $S
  echo "#### prefill $n fused=$v" >> $OUT/w4_model.txt; cat /tmp/p.txt >> $OUT/w4_model.txt; done; done; done
echo "elapsed $(el) s" | tee -a $S
