#!/usr/bin/env bash
# Same warm machine as callB1 (its kiln in build/release, its libs in /tmp/rtlibs): C = 32 random weights,
# n-gram vs plain, with the n-gram indexes filled during forwards (default) and without (A/B).
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
xz -dc .carry/tok.tar.xz | tar xf -
ls build/release/bin/kiln /tmp/rtlibs >/dev/null || exit 3
[[ -e /work/main ]] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=/tmp/rtlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} KILN=$PWD/build/release/bin/kiln
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/c1_summary.txt
for v in 1 0; do
  KILN_SPEC_INDEX_DURING_FORWARD=$v SPEC_C32_ROUNDS=3 OUT=/tmp/c1_$v bash bench/device.sh spec-c32-random > $OUT/c1_spec_index$v.txt 2>&1
  echo "index_during_forward=$v rc=$? $(el) s" >> $OUT/c1_summary.txt
done
# The classes of 17+ sequences started off, now that a probe finds the prompts indexed.
KILN_SPEC_START_OFF_FROM=17 SPEC_C32_ROUNDS=3 OUT=/tmp/c1_s17 bash bench/device.sh spec-c32-random > $OUT/c1_spec_startoff17.txt 2>&1
echo "start_off_from=17 rc=$? $(el) s" >> $OUT/c1_summary.txt
# Time left: the fused router's stall samples by CUDA line (before its next change).
if (( $(el) < 330 )); then
export KILN=$PWD/build/release/bin/kiln
NCU_SOURCE=1 NCU_COUNT=8 NCU_TUNE="qwen3-30b-a3b --quantization fp8" NCU_KERNEL=router_route NCU_SECONDS=200 \
  NCU_CMD="bench model --shape qwen3-30b-a3b --quantization fp8 --prefill 1 --context 2 --steps 1 --no-breakdown" \
  OUT=/tmp/ncuout bash bench/device.sh ncu-cmd > /tmp/ncu_log.txt 2>&1
echo "ncu rc=$? $(el) s" >> $OUT/c1_summary.txt
find /tmp/ncuout -name "ncu-cmd-source-*.txt" -exec cp {} $OUT/ \; 2>/dev/null
tail -45 /tmp/ncu_log.txt > $OUT/c1_ncu_log.txt
fi
grep -h -E "C=32|median|kiln_spec" $OUT/c1_spec_index1.txt $OUT/c1_spec_index0.txt $OUT/c1_spec_startoff17.txt | cut -c1-400
cat $OUT/c1_summary.txt
