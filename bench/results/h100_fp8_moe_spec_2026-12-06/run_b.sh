#!/usr/bin/env bash
# Run from the repository root on the GPU machine with .deps carried (docs/BENCH.md); .carry/commit names the commit.
# Final run, part B: whole-model rows (4B and 8B, BF16 and FP8; 30B-A3B), each beside its floor, one card.
set -u
K=build/device/bin/kiln
export KILN_TUNE_CACHE=/tmp/final-tactics.txt
t0=$(date +%s)
bm() { echo "==== $*"; timeout 120 $K bench model "$@" 2>&1 | grep -E "^device|TPOT|decode batch|prefill|verify step|error"; }
{
  timeout 100 $K tune --shape qwen3-4b --quantization fp8 --max-tokens 8192 --max-logit-rows 8 2>&1 | tail -3
  echo "tune4b $(( $(date +%s) - t0 )) s"
  bm --shape qwen3-4b --quantization fp8 --context 1024 --steps 32 --batch 8 --no-breakdown
  bm --shape qwen3-4b --context 1024 --steps 32 --batch 8 --verify-rows 4,8 --no-breakdown
  bm --shape qwen3-4b --quantization fp8 --context 2 --steps 1 --prefill 8192 --no-breakdown
  bm --shape qwen3-4b --context 2 --steps 1 --prefill 8192 --no-breakdown
  echo "4b $(( $(date +%s) - t0 )) s"
  bm --shape qwen3-30b-a3b --context 1024 --steps 16 --batch 64 --prefill 4096 --no-breakdown
  bm --shape qwen3-30b-a3b --quantization fp8 --context 1024 --steps 16 --batch 8 --no-breakdown
  timeout 60 $K tune --shape qwen3-8b --quantization fp8 --max-tokens 8 --max-logit-rows 8 2>&1 | tail -1
  bm --shape qwen3-8b --quantization fp8 --context 1024 --steps 32 --no-breakdown
  bm --shape qwen3-8b --context 1024 --steps 32 --no-breakdown
  echo "8b $(( $(date +%s) - t0 )) s"
  echo "all $(( $(date +%s) - t0 )) s"
} > "$OUT/model.txt" 2>&1
cat "$OUT/model.txt"
