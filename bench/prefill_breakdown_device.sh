#!/usr/bin/env bash
# Where one whole-model prefill goes, kernel by kernel (GPU machine, .deps/sysroot carried): builds kiln,
# tunes the 4B shape's GEMMs, then for each prompt length in LENS (default "4096 8192") runs
# `kiln bench model --prefill N` under ncu (--profile-from-start off: the profiler range holds exactly one
# forward; only gpu__time_duration, caches not flushed, clocks not locked) and summarises it with
# bench/prefill_breakdown.py. Also prints the same process's timed prefill row (its forwards outside the
# profiler range, so not profiled, though the process runs under ncu). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
t0=$(date +%s)
if [[ ${NO_BUILD:-0} != 1 ]]; then
  bash scripts/device_build.sh kiln >"$out/build.log" 2>&1 || { grep -B2 -A12 -m3 error "$out/build.log"; exit 1; }
  echo "build: $(($(date +%s) - t0)) s"
fi
k=${KILN:-build/device/bin/kiln}
export KILN_TUNE_CACHE=${KILN_TUNE_CACHE:-/tmp/kiln-gemm-tactics.txt}
$k tune --shape qwen3-4b --max-tokens 8192 --max-logit-rows 128 >"$out/tune.log" 2>&1
for n in ${LENS:-4096 8192}; do
  timeout 120 ncu --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv $k bench model --shape qwen3-4b --context 2 --steps 1 --prefill "$n" \
    --no-breakdown >"$out/ncu_prefill_$n.csv" 2>"$out/ncu_prefill_$n.err"
  echo "ncu prefill $n rc=$? ($(($(date +%s) - t0)) s)"
  grep -E "^prefill" "$out/ncu_prefill_$n.csv"
  python3 bench/prefill_breakdown.py "$out/ncu_prefill_$n.csv" 36 | tee "$out/prefill_breakdown_$n.txt" | head -45
done
