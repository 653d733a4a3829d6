#!/usr/bin/env bash
# MoE e4m3 x 16 gather GEMV tests (commit in .carry/commitT1), test binaries built here.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
mv .carry/rtmid.tgz .carry/rtlibs.tgz; mv .carry/pbT.tar.xz .carry/prebuilt.tar.xz; source scripts/device_prebuilt.sh unpack
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/t1_tests.txt
T=build/release/tests
rt() { local n=$1 lim=$2; shift 2; echo "######## $n $*" >> $OUT/t1_tests.txt
  timeout "$lim" $T/$n "$@" >> $OUT/t1_tests.txt 2>&1; local rc=$?
  echo "$n rc=$rc $(el) s: $(grep -E -c '^\[       OK' $OUT/t1_tests.txt) ok so far; failed: $(grep -E '^\[  FAILED  \] [A-Za-z]' $OUT/t1_tests.txt | sort -u | tr '\n' ' ')"; }
for t in test_cuda_moe_fp8_x16 test_cuda_moe_fp8 test_cuda_moe_ep; do rt $t 150; done
grep -E "^\[  PASSED|^\[  FAILED|Failure|Expected|actual" $OUT/t1_tests.txt | head -30 | cut -c1-200
echo "all $(el) s"
