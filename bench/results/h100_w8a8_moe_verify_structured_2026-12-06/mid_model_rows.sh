#!/usr/bin/env bash
# Mid run, part 2 (same warm machine): kernel rows and model rows of the merged branches.
set -u
[[ -d .deps/sysroot ]] || tar xzf .carry/deps.tgz
export KILN_COMMIT=$(cat .carry/integ_commit)
K=build/device/bin/kiln
t0=$(date +%s)
KILN_BUILD_DIR=build/device bash scripts/device_build.sh kiln > "$OUT/build2.txt" 2>&1 || { tail -30 "$OUT/build2.txt"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
{ timeout 100 $K bench kernels --filter =gemv_fp8 2>&1 | grep -E "^device|w8a8|tc w8 x2|fma w4|engine" ; } > "$OUT/gemv_fp8.txt" 2>&1
echo "gemv_fp8 $(( $(date +%s) - t0 )) s"
timeout 100 $K bench kernels --filter moe > "$OUT/moe_bench.txt" 2>&1
echo "moe $(( $(date +%s) - t0 )) s"
bm() { echo "==== $*"; timeout 100 $K bench model "$@" 2>&1 | grep -E "^device|TPOT|decode batch|prefill|verify step|error|rror"; }
{
  export KILN_TUNE_CACHE=/tmp/mid-on.txt
  bm --shape qwen3-4b --quantization fp8 --context 1024 --steps 32 --no-breakdown
  KILN_TUNE_CACHE=/tmp/mid-off.txt KILN_GEMV_W8A8=0 bm --shape qwen3-4b --quantization fp8 --context 1024 --steps 32 --no-breakdown
  bm --shape qwen3-4b --context 1024 --steps 32 --verify-rows 4,8 --no-breakdown
  bm --shape qwen3-30b-a3b --context 1024 --steps 16 --no-breakdown
  bm --shape qwen3-30b-a3b --quantization fp8 --context 1024 --steps 16 --no-breakdown
  echo "models $(( $(date +%s) - t0 )) s"
  timeout 100 $K tune --shape qwen3-4b --quantization fp8 --show 2>&1 | grep -E "e4m3" | head -24
} > "$OUT/model.txt" 2>&1
echo "all $(( $(date +%s) - t0 )) s"
cat "$OUT/model.txt" | cut -c1-250; grep -E "w8a8" "$OUT/gemv_fp8.txt" | head -30 | cut -c1-200; grep -E "^\|" "$OUT/moe_bench.txt" | head -30 | cut -c1-200
