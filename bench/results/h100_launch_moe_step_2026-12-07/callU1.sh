#!/usr/bin/env bash
# MoE/router tests at HEAD + the launch() shared-memory opt-in test; binaries built here (tree: HEAD + launch fix).
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
mv .carry/rtmid.tgz .carry/rtlibs.tgz; mv .carry/pbU1.tar.xz .carry/prebuilt.tar.xz; source scripts/device_prebuilt.sh unpack
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/u1_tests.txt
T=build/release/tests
rt() { local n=$1 lim=$2; shift 2; echo "######## $n $*" >> $OUT/u1_tests.txt
  timeout "$lim" $T/$n "$@" >> $OUT/u1_tests.txt 2>&1; local rc=$?
  echo "$n rc=$rc $(el) s: $(grep -E -c '^\[       OK' $OUT/u1_tests.txt) ok so far; failed: $(grep -E '^\[  FAILED  \] [A-Za-z]' $OUT/u1_tests.txt | sort -u | tr '\n' ' ')"; }
rt test_cuda_launch 60
rt test_cuda_moe_fp8 240
rt test_cuda_moe_router 200
grep -E "^\[  PASSED|^\[  FAILED|Failure|Expected|actual" $OUT/u1_tests.txt | head -30 | cut -c1-200
echo "all $(el) s"
