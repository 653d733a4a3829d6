#!/usr/bin/env bash
# kiln of .carry/commitU1 + launch fix (built here): the 30B-A3B FP8 batch-1 step with the QKV GEMV's
# residual-norm prologue on / off / in fewer blocks, then ncu (full + source) of the step's dense GEMVs.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
mv .carry/rtmid.tgz .carry/rtlibs.tgz; mv .carry/pbU3.tar.xz .carry/prebuilt.tar.xz; source scripts/device_prebuilt.sh unpack
S=$OUT/u3_summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $S
timeout 240 build/release/tests/test_cuda_moe_fp8_x16 > $OUT/u3_tests.txt 2>&1; echo "test_cuda_moe_fp8_x16 rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/u3_tests.txt | tr '\n' ' ') $(el) s" | tee -a $S
timeout 60 build/release/tests/test_cuda_launch >> $OUT/u3_tests.txt 2>&1; echo "test_cuda_launch rc=$? $(el) s" | tee -a $S
export KILN_TUNE_CACHE=/tmp/tc30
$KILN tune --shape qwen3-30b-a3b --quantization fp8 --max-tokens 8 --max-logit-rows 8 > /tmp/tune.txt 2>&1
echo "tune rc=$? $(el) s" | tee -a $S
grep -iE "norm|gemv" /tmp/tune.txt | head -20 > $OUT/u3_tune.txt
m() { local tag=$1; shift
  env "$@" timeout 120 $KILN bench model --shape qwen3-30b-a3b --quantization fp8 --context 1024 --steps 32 --no-breakdown > /tmp/m.txt 2>&1
  echo "$tag rc=$? $(grep -hE 'CUDA graph' /tmp/m.txt | head -2 | sed 's/decode TPOT at context 1024//g' | tr '\n' ' ')" | tee -a $S
  echo "#### $tag" >> $OUT/u3_model.txt; cat /tmp/m.txt >> $OUT/u3_model.txt; }
for r in 1 2; do
  m "default" KILN_X=1
  m "norm_in=0" KILN_GEMV_NORM_IN=0
  m "norm_in=2" KILN_GEMV_NORM_IN=2
  m "groups=2" KILN_GEMV_NORM_IN_GROUPS=2
  m "groups=4" KILN_GEMV_NORM_IN_GROUPS=4
  m "l2persist x16=1" KILN_MOE_ROUTER_L2_PERSIST=1
  m "x16=0" KILN_MOE_FP8_E4M3X16=0
  m "l2persist x16=0" KILN_MOE_ROUTER_L2_PERSIST=1 KILN_MOE_FP8_E4M3X16=0
done
echo "bench done $(el) s" | tee -a $S
export KILN_TUNE_CACHE=/tmp/tc4
$KILN tune --shape qwen3-4b --quantization fp8 --max-tokens 8 --max-logit-rows 8 > /tmp/tune4.txt 2>&1
echo "tune 4b rc=$? $(el) s" | tee -a $S
m4() { local tag=$1; shift
  env "$@" timeout 120 $KILN bench model --shape qwen3-4b --quantization fp8 --context 1024 --steps 32 --no-breakdown > /tmp/m.txt 2>&1
  echo "4b $tag rc=$? $(grep -hE 'CUDA graph' /tmp/m.txt | head -2 | sed 's/decode TPOT at context 1024//g' | tr '\n' ' ')" | tee -a $S
  echo "#### 4b $tag" >> $OUT/u3_model.txt; cat /tmp/m.txt >> $OUT/u3_model.txt; }
for r in 1 2; do
  m4 "default" KILN_X=1
  m4 "norm_in=0" KILN_GEMV_NORM_IN=0
  m4 "groups=4" KILN_GEMV_NORM_IN_GROUPS=4
done
export KILN_TUNE_CACHE=/tmp/tc30
echo "bench 4b done $(el) s" | tee -a $S
(( $(el) < 330 )) && NCU_SOURCE=1 NCU_COUNT=4 NCU_KERNEL=gemv_kernel NCU_SECONDS=120 \
  NCU_CMD="bench model --shape qwen3-30b-a3b --quantization fp8 --prefill 1 --context 2 --steps 1 --no-breakdown" \
  OUT=/tmp/ncuout bash bench/device.sh ncu-cmd > /tmp/ncu_log.txt 2>&1
echo "ncu gemv rc=$? $(el) s" | tee -a $S
cp /tmp/ncuout/ncu-cmd-source-sass.txt $OUT/u3_gemv_source_sass.txt 2>/dev/null
cp /tmp/ncuout/ncu-cmd-source-cuda.txt $OUT/u3_gemv_source_cuda.txt 2>/dev/null
find /tmp/ncuout -name report.txt -exec cp {} $OUT/u3_gemv_report.txt \;
find /tmp/ncuout -name "source-cuda.csv" -exec sh -c 'head -c 3000 "$1" > '$OUT'/u3_source_cuda_head.csv' _ {} \;
for v in 1 0 p0; do for cc in none; do
  (( $(el) > 470 )) && continue
  KILN_MOE_ROUTER_L2_PERSIST=$([[ $v == p* ]] && echo 1 || echo 0) KILN_MOE_FP8_E4M3X16=${v#p} timeout 100 ncu --clock-control none --cache-control $cc -k regex:router_route -c 8 \
    --metrics gpu__time_duration.sum --csv $KILN bench model --shape qwen3-30b-a3b --quantization fp8 --context 2 --steps 1 \
    --prefill 1 --no-breakdown > /tmp/r.csv 2>/dev/null
  echo "router x16=$v cache=$cc rc=$? $(grep -h gpu__time_duration /tmp/r.csv | awk -F'","' '{print $NF}' | tr -d '"' | tr '\n' ' ') $(el) s" | tee -a $S
done; done
cat $S
