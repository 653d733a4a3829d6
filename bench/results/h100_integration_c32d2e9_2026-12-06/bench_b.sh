#!/usr/bin/env bash
# Model-level benches (after mid_bench.sh's kernel rows): each tunes its shape into its own cache first.
set -u
B=build/device; K=$B/bin/kiln
left() { echo $(( ${BUDGET:-585} - ($(date +%s) - ${CALL_T0}) )); }
step() { # seconds-needed label cmd...
  local need=$1 label=$2; shift 2
  if (( $(left) < need )); then echo "## SKIP $label (left $(left) s)"; return; fi
  local s=$(date +%s)
  echo "## $label (left $(left) s)"; timeout $(( $(left) - 5 )) bash -c "$*" 2>&1 | grep -v '^kiln: ' | tail -25
  echo "## took $(( $(date +%s) - s )) s"
}
tm() { echo "KILN_TUNE_CACHE=/tmp/tac-$1.txt $K tune --shape $2 ${3:-} --max-tokens 16 --max-logit-rows 8 | tail -2"; }
step 60 "tune 4B fp8" "$(tm 4bfp8 qwen3-4b '--quantization fp8')"
step 40 "4B fp8 decode" "KILN_TUNE_CACHE=/tmp/tac-4bfp8.txt $K bench model --shape qwen3-4b --quantization fp8 --context 1024 --steps 16 --no-breakdown"
step 60 "tune 4B" "$(tm 4b qwen3-4b)"
step 60 "4B decode + verify 4/8" "KILN_TUNE_CACHE=/tmp/tac-4b.txt $K bench model --shape qwen3-4b --context 1024 --steps 16 --verify-rows 4,8 --no-breakdown"
step 60 "tune 30B" "$(tm 30b qwen3-30b-a3b)"
step 40 "30B decode" "KILN_TUNE_CACHE=/tmp/tac-30b.txt $K bench model --shape qwen3-30b-a3b --context 1024 --steps 16 --no-breakdown"
step 60 "tune 30B fp8" "$(tm 30bfp8 qwen3-30b-a3b '--quantization fp8')"
step 60 "30B fp8 decode" "KILN_TUNE_CACHE=/tmp/tac-30bfp8.txt $K bench model --shape qwen3-30b-a3b --quantization fp8 --context 1024 --steps 16 --no-breakdown"
