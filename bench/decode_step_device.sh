#!/usr/bin/env bash
# The decode step (issue 11) in one GPU-machine call (device tool, carrying .deps/sysroot): builds kiln and the
# GPU tests the decode path touches, runs them, tunes the 4B and 0.6B shapes (kiln's kernels timed with PDL,
# as the graphs run them), then `kiln bench model` rows: 4B ctx 1024 batch 1 and 8 with the per-op breakdown
# (each op without and with PDL), 4B ctx 8192 batch 1 (bf16 and fp8 cache), 4B fp8 ctx 8192 batch 32 and 128,
# 0.6B ctx 1024 batch 1 and 8. SITES=1 adds the PDL A/B by op family (KILN_PDL_SITES); SERVE=1 the serving
# row at C = 1 (8192 in / 1024 out, 4 prompts, bench/h200_sweep_quick.sh). Logs under $OUT, a summary last.
# Usage: OUT=DIR [SITES=1] [SERVE=1] bench/decode_step_device.sh   (about 2 minutes; +1 each option)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
t0=$(date +%s)
tests=(test_cuda_gemv test_cuda_gemv_add_rms_norm test_cuda_gemv_norm_in test_gemv_attn_prep test_attn_prep
  test_cuda_graph test_cuda_model)
bash scripts/device_build.sh kiln "${tests[@]}" >"$out/build.log" 2>&1 ||
  { grep -B2 -A12 -m3 "error" "$out/build.log"; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
for t in "${tests[@]}"; do
  timeout 300 "build/device/tests/$t" --gtest_brief=1 >"$out/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$out/$t.log" | tr '\n' ' ')"
done
k=build/device/bin/kiln
export KILN_TUNE_CACHE=${KILN_TUNE_CACHE:-/tmp/kiln-gemm-tactics.txt}
{ $k tune --shape qwen3-4b --max-tokens 160 --max-logit-rows 128 && $k tune --shape qwen3-0.6b --max-tokens 16 \
  --max-logit-rows 1; } >"$out/tune.log" 2>&1
echo "tune rc=$? ($(($(date +%s) - t0)) s)"
log=$out/bench_model.log
{
  echo "==== 4B ctx 1024 batch 1, 8 + breakdown"
  $k bench model --shape qwen3-4b --context 1024 --steps 32 --batch 8
  echo "==== 4B ctx 8192 batch 1, bf16 cache"
  $k bench model --shape qwen3-4b --context 8192 --steps 16 --no-breakdown
  echo "==== 4B ctx 8192 batch 1, 32, 128, fp8 cache"
  $k bench model --shape qwen3-4b --kv-dtype fp8 --context 8192 --steps 16 --batch 32,128 --no-breakdown
  echo "==== 0.6B ctx 1024 batch 1, 8"
  $k bench model --shape qwen3-0.6b --context 1024 --steps 64 --batch 8 --no-breakdown
} >"$log" 2>&1
echo "bench model rc=$? ($(($(date +%s) - t0)) s)"
if [[ ${SITES:-0} == 1 ]]; then
  for v in all gemv attention elementwise,lm_head; do
    [[ $v == all ]] && e=() || e=("KILN_PDL_SITES=$v")
    echo "==== PDL sites $v: $(env "${e[@]}" $k bench model --shape qwen3-4b --context 1024 --steps 32 --no-breakdown 2>&1 |
      grep -E 'CUDA graph' | sed 's/.*(CUDA graph\(.*\)): median \([0-9.]*\) ms.*/\1 \2/' | tr '\n' ' ')" >>"$log"
  done
fi
if [[ ${SERVE:-0} == 1 ]]; then
  CONC=1 NUM=4 SWEEP_SECONDS=80 bash bench/h200_sweep_quick.sh "$out/serve_c1" >"$out/serve_c1.log" 2>&1
  echo "serving C=1 rc=$? ($(($(date +%s) - t0)) s)"
fi
echo "---- summary ($(($(date +%s) - t0)) s)"
grep -E "^====|TPOT .*CUDA graph|decode batch" "$log"
grep -A16 "per-op breakdown" "$log" | head -17
[[ -f $out/serve_c1.log ]] && grep -E "C=1:" "$out/serve_c1.log"
exit 0
