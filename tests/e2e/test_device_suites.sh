#!/usr/bin/env bash
# bench/device.sh off the GPU machine: bench/device/figures.py on saved outputs (bench/results) and on a made-up
# invalid level; a GPU suite's "SKIPPED" row where no GPU is visible; the fp8-serve suite's serving part as a CPU
# dry run on the demo checkpoint (servers on free ports), the same of moe-serve on the demo MoE checkpoint, every
# summary row holding figures. A broken parser or
# suite would otherwise show only on the GPU machine, after its time was spent.
# Usage: test_device_suites.sh KILN FIXTURES_DIR SRC_DIR
KILN=$1
SRC=$3  # $2, the e2e fixtures: unused (the suite writes its own demo checkpoint)
source "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || skip "python3 is not installed"
fig() { python3 "$SRC/bench/device/figures.py" "$@"; }
expect() { [[ $1 == "$2" ]] || fail "$3: got '$1', expected '$2'"; }

# figures.py on a saved `kiln bench serve` JSON (the 2026-12-03 C = 4 run) and `kiln bench model` output.
json=$SRC/bench/results/h200_c4_4096in_1out_2026-12-03.json
model=$SRC/bench/results/h100_fp8_moe_spec_2026-12-06/bench_model.txt
expect "$(fig value "$json" e2e_p50)" 244.396 "E2E p50 of the saved run"
expect "$(fig value "$json" out_tok_s 4)" 16.35 "out tok/s of level 4"
expect "$(fig value "$json" e2e_p50 8)" n/a "a level the run does not have"
expect "$(fig value "$E2E_LOG_DIR/absent.json" e2e_p50)" n/a "a run that left no JSON"
fig serve "$json" | grep -q '^C=4, 200 prompts: 16.4 out tok/s, 16.35 req/s, .*E2E p50 244.4 / p99 256.1 ms$' ||
  fail "serve line: $(fig serve "$json")"
python3 - "$json" "$E2E_LOG_DIR/invalid.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["levels"][0].update(valid=False, failed=1, notes=["request 3: HTTP 503: queue full"])
json.dump(d, open(sys.argv[2], "w"))
PY
expect "$(fig value "$E2E_LOG_DIR/invalid.json" e2e_p50)" n/a "an invalid level's figure"
fig serve "$E2E_LOG_DIR/invalid.json" | grep -q 'INVALID (1 failed, .*HTTP 503' || fail "invalid level's serve line"
expect "$(fig model "$model" prefill)" 129.65 "the first prefill line of the saved model run"
expect "$(fig model "$model" tpot)" 3.044 "the first graph + PDL TPOT of the saved model run"
expect "$(fig verdict 129.65 "<=" 95)" missed "verdict <="
expect "$(fig verdict 3900 ">=" 3800)" met "verdict >="
expect "$(fig verdict n/a "<=" 95)" n/a "verdict of no figure"

# device.sh in a folder of its own (WORK, SCRATCH, OUT), so that parallel tests share nothing.
device() {
  KILN=$KILN KILN_TUNE_CACHE=$E2E_LOG_DIR/tactics.txt WORK=$E2E_LOG_DIR/work SCRATCH=$E2E_LOG_DIR/scratch OUT=$E2E_LOG_DIR/out bash "$SRC/bench/device.sh" "$@"
}
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  device seed >"$E2E_LOG_DIR/seed.txt" 2>&1 || fail "device.sh seed without a GPU: $(tail -3 "$E2E_LOG_DIR/seed.txt")"
  grep -q '^| seed .*SKIPPED: no GPU visible' "$E2E_LOG_DIR/seed.txt" ||
    fail "no SKIPPED row: $(cat "$E2E_LOG_DIR/seed.txt")"
fi

# The serving part of fp8-serve on the CPU: FP8 and BF16 weights, FP8 KV, every row's figures numbers.
DEVICE=cpu SHAPE=demo SEED_IN=48 SEED_NUM=4 SHORT_IN=24 SHORT_OUT=4 SHORT_NUM=2,4 BIG_IN=48 BIG_OUT=4 BIG_CONC=2 \
  BIG_NUM=2 device fp8-serve >"$E2E_LOG_DIR/fp8-serve.txt" 2>&1 || fail "device.sh fp8-serve (CPU dry run)"
summary=$E2E_LOG_DIR/out/summary.txt
[[ -f $summary ]] || fail "no summary.txt: $(tail -5 "$E2E_LOG_DIR/fp8-serve.txt")"
for w in fp8 bf16; do
  grep -qE "^\| fp8-serve +\| seed /generate 48/1 C=4, $w weights .*rc=0 C=4, 4 prompts: [0-9.]+ out tok/s" \
    "$summary" ||
    fail "seed row ($w): $(cat "$summary")"
  grep -qE "^\| fp8-serve +\| 24/4 C=1,32, $w weights .*rc=0 C=1, 2 prompts: .*; C=32, 4 prompts: [0-9.]+ out" \
    "$summary" ||
    fail "1024/256 row ($w): $(cat "$summary")"
done
grep -qE '^\| fp8-serve +\| 48/4 C=2 FP8 KV, fp8 weights .*rc=0 C=2, 2 prompts: [0-9.]+ out tok/s' "$summary" ||
  fail "8192/1024 row: $(cat "$summary")"
grep -qE '^\| fp8-serve +\| seed workload E2E p50 .*FP8 [0-9.]+ ms \(target <= 165: (met|missed)\), BF16 [0-9.]+ ms' \
  "$summary" || fail "seed target row: $(cat "$summary")"
grep -qE '^\| fp8-serve +\| 48/4 C=2 FP8 KV out tok/s .*FP8 weights [0-9.]+ \(target >= 3800: missed; 2 prompts\)' \
  "$summary" || fail "8192/1024 target row: $(cat "$summary")"
if grep -q 'n/a' "$summary"; then fail "a figure is missing: $(grep 'n/a' "$summary")"; fi

# The serving part of moe-serve on the CPU: the demo MoE checkpoint, BF16 and FP8 experts.
rm -rf "$E2E_LOG_DIR/out"
DEVICE=cpu SHAPE=demo MOE_IN_10=32 MOE_OUT_10=4 MOE_NUM_10=2 MOE_IN_64=32 MOE_OUT_64=4 MOE_NUM_64=4 \
  device moe-serve >"$E2E_LOG_DIR/moe-serve.txt" 2>&1 || fail "device.sh moe-serve (CPU dry run)"
[[ -f $summary ]] || fail "no moe-serve summary.txt: $(tail -5 "$E2E_LOG_DIR/moe-serve.txt")"
for w in bf16 fp8; do
  grep -qE "^\| moe-serve +\| 32/4 C=10, $w experts .*rc=0 C=10, 2 prompts: [0-9.]+ out tok/s" "$summary" ||
    fail "C=10 row ($w): $(cat "$summary")"
  grep -qE "^\| moe-serve +\| C=10 TPOT p50, $w experts .*[0-9.]+ ms \(target <= 6: (met|missed)\)" "$summary" ||
    fail "C=10 target row ($w): $(cat "$summary")"
  grep -qE "^\| moe-serve +\| C=64 out tok/s, $w experts .*[0-9.]+ \(BF16 target >= 3500: missed\)" "$summary" ||
    fail "C=64 target row ($w): $(cat "$summary")"
done
if grep -q 'n/a' "$summary"; then fail "a figure is missing: $(grep 'n/a' "$summary")"; fi
echo "PASS test_device_suites"
