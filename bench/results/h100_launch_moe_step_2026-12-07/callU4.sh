#!/usr/bin/env bash
# kiln + test_cuda_graph + test_cuda_gemv_norm_in of the commit in .carry/commitU4 (built here): the tests, then
# the batch-1 step with the residual-norm prologue chosen from the whole step (default) against the tuner's
# choice (KILN_GEMV_NORM_IN=1 skips the step choice), alternating, one tactic cache per shape.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
mv .carry/rtmid.tgz .carry/rtlibs.tgz; mv .carry/pbU4.tar.xz .carry/prebuilt.tar.xz; source scripts/device_prebuilt.sh unpack
S=$OUT/u4_summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $S
for t in test_cuda_graph test_cuda_gemv_norm_in; do
  timeout 150 build/release/tests/$t >> $OUT/u4_tests.txt 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/u4_tests.txt | tail -2 | tr '\n' ' ') $(el) s" | tee -a $S
done
m() { local shape=$1 q=$2 tag=$3; shift 3
  env "$@" timeout 150 $KILN bench model --shape $shape $q --context 1024 --steps 32 --no-breakdown > /tmp/m.txt 2>&1
  echo "$shape $q $tag rc=$? $(grep -hE 'residual-norm|CUDA graph' /tmp/m.txt | sed 's/decode TPOT at context 1024//g;s/kiln: batch-1 decode step//' | tr '\n' ' ')" | tee -a $S
  echo "#### $shape $q $tag" >> $OUT/u4_model.txt; cat /tmp/m.txt >> $OUT/u4_model.txt; }
for spec in "qwen3-30b-a3b --quantization=fp8" "qwen3-4b --quantization=fp8" "qwen3-8b --quantization=fp8" "qwen3-30b-a3b "; do
  shape=${spec%% *}; q=${spec#* }; q=${q/=/ }
  (( $(el) > 280 )) && break
  export KILN_TUNE_CACHE=/tmp/tc_${shape}_${q// /}
  $KILN tune --shape $shape $q --max-tokens 8 --max-logit-rows 8 > /dev/null 2>&1
  echo "tune $shape $q rc=$? $(el) s" | tee -a $S
  for r in 1 2; do m $shape "$q" step-choice KILN_X=1; m $shape "$q" tuner KILN_GEMV_NORM_IN=1; done
done
cat $S
