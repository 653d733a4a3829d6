#!/usr/bin/env bash
# Profiling call: per-kernel decode-like breakdowns (one token prefill) for 30B-A3B and 4B FP8, ncu detail of the
# FP8 GEMV the tuner picks, the attention kernels of a verify step.
set -u
K=build/device/bin/kiln
export KILN_TUNE_CACHE=/tmp/prof-tactics.txt
t0=$(date +%s)
KILN_BUILD_DIR=build/device bash scripts/device_build.sh kiln > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name --format=csv,noheader
{
timeout 90 $K tune --shape qwen3-30b-a3b --max-tokens 8 --max-logit-rows 8 2>&1 | tail -1
timeout 90 $K tune --shape qwen3-30b-a3b --quantization fp8 --max-tokens 8 --max-logit-rows 8 2>&1 | tail -1
timeout 90 $K tune --shape qwen3-4b --quantization fp8 --max-tokens 8 --max-logit-rows 8 2>&1 | tail -1
timeout 90 $K tune --shape qwen3-4b --max-tokens 8 --max-logit-rows 8 2>&1 | tail -1
} > "$OUT/tune.txt" 2>&1
echo "tune $(( $(date +%s) - t0 )) s"
prof() { # name layers args...
  local n=$1 l=$2; shift 2
  timeout 150 ncu --profile-from-start off --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    $K bench model "$@" --context 2 --steps 1 --no-breakdown > /tmp/$n.csv 2>/tmp/$n.err
  echo "==== $n rc=$? ($*)"; python3 bench/prefill_breakdown.py /tmp/$n.csv $l 2>&1 | head -45
}
{
prof moe_bf16_t1 48 --shape qwen3-30b-a3b --prefill 1
prof moe_fp8_t1 48 --shape qwen3-30b-a3b --quantization fp8 --prefill 1
prof d4b_fp8_t1 36 --shape qwen3-4b --quantization fp8 --prefill 1
prof d4b_bf16_t1 36 --shape qwen3-4b --prefill 1
prof d4b_bf16_t4 36 --shape qwen3-4b --prefill 4
} > "$OUT/breakdown.txt" 2>&1
echo "breakdown $(( $(date +%s) - t0 )) s"
timeout 120 ncu --profile-from-start off --clock-control none -k regex:gemv -c 3 --set full \
  $K bench model --shape qwen3-4b --quantization fp8 --prefill 1 --context 2 --steps 1 --no-breakdown > "$OUT/ncu_gemv_fp8.txt" 2>&1
echo "ncu gemv $(( $(date +%s) - t0 )) s"
timeout 120 ncu --clock-control none -k "regex:prefill|decode|combine" -c 400 --metrics gpu__time_duration.sum --csv \
  $K bench model --shape qwen3-4b --context 1024 --steps 1 --batch 1 --verify-rows 4 --no-breakdown > /tmp/verify.csv 2>/tmp/verify.err
python3 - > "$OUT/verify_attn.txt" 2>&1 <<'PY'
import csv, collections
rows=[l for l in open('/tmp/verify.csv') if l.startswith('"')]
agg=collections.defaultdict(list)
for r in csv.DictReader(rows):
    if r.get("Metric Name")!="gpu__time_duration.sum": continue
    v=float(r["Metric Value"].replace(",",""))*{"ns":1e-3,"us":1,"ms":1e3,"nsecond":1e-3,"usecond":1,"msecond":1e3}[r["Metric Unit"]]
    agg[(r["Kernel Name"].split("(")[0][:90], r["Grid Size"], r["Block Size"])].append(v)
for k,v in sorted(agg.items(), key=lambda x:-sum(x[1])):
    v.sort(); print(f"{len(v):5d} x median {v[len(v)//2]:8.2f} us  {k}")
PY
echo "all $(( $(date +%s) - t0 )) s"
cat "$OUT/tune.txt"; cat "$OUT/breakdown.txt" | cut -c1-160 | head -150; head -30 "$OUT/verify_attn.txt"
