#!/usr/bin/env bash
# kiln + tests of .carry/commitW1 (built here). (1) tests untested on a GPU since cfa1795/61103fe, beside the
# training of the small Qwen3 (24 layers, 150 s, no draft); (2) batch 1 on it: plain vs n-gram with shadow drafts
# (default) vs n-gram learning from verify steps (KILN_SPEC_SHADOW=0); (3) C = 32 random weights, plain vs n-gram,
# shadow on and off, 3 pairs each; (4) time left: the 30B FP8 batch-1 step, default vs KILN_GEMV_NORM_IN=1 vs =0.
set -u
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
mv .carry/rtmid.tgz .carry/rtlibs.tgz; mv .carry/pbW1.tar.xz .carry/prebuilt.tar.xz; source scripts/device_prebuilt.sh unpack
xz -dc .carry/tok.tar.xz | tar xf -
S=$OUT/w3_summary.txt
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $S
( SPEC_MODELS=/tmp/spec-models SPEC_TARGET_ARGS="--layers 24" SPEC_TRAIN_MIN=2.5 SPEC_DRAFT_MIN=0 SPEC_BATCH1=0 SPEC_C32=0 \
  OUT=/tmp/w3 bash bench/device.sh spec > $OUT/w3_train.txt 2>&1; echo "trained rc=$? $(el) s" >> $S ) &
tp=$!
for t in test_cuda_graph test_cuda_moe_router test_cuda_gemv_norm_in; do
  timeout 120 build/release/tests/$t > /tmp/w3_$t.txt 2>&1; echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' /tmp/w3_$t.txt | tr '\n' ' ')" | tee -a $S
  grep -E "FAILED|Failure" -A3 /tmp/w3_$t.txt | head -20 >> $OUT/w3_tests.txt
done
wait $tp; echo "after training $(el) s" | tee -a $S
m=/tmp/spec-models/small_qwen3
ng="--speculative-algorithm ngram --speculative-num-draft-tokens 5 --speculative-ngram-max-match-window-size 8"
timeout 240 python3 scripts/spec_measure.py --kiln "$KILN" --model $m --heldout $m/heldout_files.txt --device cuda \
  --prompts 6 --max-tokens 128 --logs /tmp/w3logs --config "plain=" --config "ngram_shadow=$ng" \
  --config "ngram_verify_learning=KILN_SPEC_SHADOW=0 $ng" --config "ngram_shadow_2=$ng" > $OUT/w3_measure.txt 2>&1
echo "measured rc=$? $(el) s" | tee -a $S
grep -h '^|\|parts from\|per verify step' $OUT/w3_measure.txt | cut -c1-300 | tee -a $S
for v in 1 0; do
  KILN_SPEC_SHADOW=$v SPEC_C32_ROUNDS=3 OUT=/tmp/w3_s$v bash bench/device.sh spec-c32-random > $OUT/w3_spec_shadow$v.txt 2>&1
  echo "shadow=$v rc=$? $(el) s" | tee -a $S
  grep -h -E "median" $OUT/w3_spec_shadow$v.txt | cut -c1-300 | tee -a $S
done
m() { local shape=$1 q=$2 tag=$3; shift 3
  env "$@" timeout 60 $KILN bench model --shape $shape $q --context 1024 --steps 32 --no-breakdown > /tmp/m.txt 2>&1
  echo "$shape $q $tag rc=$? $(grep -hE 'residual-norm|CUDA graph \+' /tmp/m.txt | sed 's/decode TPOT at context 1024//g;s/kiln: batch-1 decode step//' | tr '\n' ' ')" | tee -a $S
  echo "#### $shape $q $tag" >> $OUT/w3_model.txt; cat /tmp/m.txt >> $OUT/w3_model.txt; }
if (( $(el) < 470 )); then
  shape=qwen3-30b-a3b; q="--quantization fp8"; export KILN_TUNE_CACHE=/tmp/tc_30bfp8
  $KILN tune --shape $shape $q --max-tokens 8 --max-logit-rows 8 > /dev/null 2>&1; echo "tuned $shape $q $(el) s" | tee -a $S
  for r in 1 2; do (( $(el) > 540 )) && break; m $shape "$q" step-choice KILN_X=1; m $shape "$q" tuner KILN_GEMV_NORM_IN=1; m $shape "$q" off KILN_GEMV_NORM_IN=0; done
fi
echo "elapsed $(el) s" | tee -a $S
