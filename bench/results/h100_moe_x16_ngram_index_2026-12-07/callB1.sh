#!/usr/bin/env bash
# kiln of .carry/commitT1: MoE kernel rows (path (c) and e4m3 x 16 beside each other), the 30B-A3B FP8 decode
# step with KILN_MOE_FP8_E4M3X16=0/1 alternating, the 4B verify step with the LM head tuned up to M = 1 / 8.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
mv .carry/rtmid.tgz .carry/rtlibs.tgz; mv .carry/pbA.tar.xz .carry/prebuilt.tar.xz; source scripts/device_prebuilt.sh unpack
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/b1_summary.txt
K=build/release/bin/kiln
timeout 120 $K bench kernels --filter =moe > $OUT/b1_moe_kernels.txt 2>&1; echo "kernels rc=$? $(el) s" >> $OUT/b1_summary.txt
export KILN_TUNE_CACHE=/tmp/tc30.txt
for f in 0 1 0 1; do
  echo "######## KILN_MOE_FP8_E4M3X16=$f" >> $OUT/b1_model.txt
  KILN_MOE_FP8_E4M3X16=$f timeout 150 $K bench model --shape qwen3-30b-a3b --quantization fp8 --context 1024 --steps 32 --batch 1,8 --no-breakdown >> $OUT/b1_model.txt 2>&1
  echo "model x16=$f rc=$? $(el) s" >> $OUT/b1_summary.txt
done
unset KILN_TUNE_CACHE
# The verify step (4B shape) with the LM head tuned at M = 1 only (default) and up to 8 (KILN_TUNE_LOGIT_ROWS=8).
for L in 1 8 1 8; do
  echo "######## KILN_TUNE_LOGIT_ROWS=$L" >> $OUT/b1_verify.txt
  KILN_TUNE_LOGIT_ROWS=$L KILN_TUNE_CACHE=/tmp/tcL$L.txt timeout 150 $K bench model --shape qwen3-4b --context 1024 --steps 32 --verify-rows 4,8 --no-breakdown >> $OUT/b1_verify.txt 2>&1
  echo "verify logit_rows=$L rc=$? $(el) s" >> $OUT/b1_summary.txt
done
grep -E "experts|gather|router|mlp" $OUT/b1_moe_kernels.txt | head -60 | cut -c1-200
grep -E "^######|batch|ms" $OUT/b1_model.txt | grep -v "^tune" | head -40 | cut -c1-200
grep -v "^tune\|^kiln:" $OUT/b1_verify.txt | head -40 | cut -c1-200
cat $OUT/b1_summary.txt
