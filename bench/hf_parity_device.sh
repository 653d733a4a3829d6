#!/usr/bin/env bash
# The two remaining Hugging Face parity checks in one GPU-machine call (through the device tool, with
# .deps/sysroot carried):   bash bench/hf_parity_device.sh [OUT]     (OUT: the argument, else $OUT)
#  1. starts, in the background, tests/fixtures/make_hf_4b_reference.py: the Qwen3-4B-shaped checkpoint and
#     its HF reference into $HF4B_DIR (default /tmp/hf4b; ~8 GB, so not under $OUT), GPU, ~2 min;
#  2. generates the Qwen3-VL fixture into tests/fixtures/hf/qwen3_vl_tiny (CPU, ~20 s) and packs it into
#     $OUT/qwen3_vl_tiny.tgz, to be unpacked here and committed;
#  3. builds kiln and the tests with scripts/device_build.sh in build/device (incremental after
#     bench/bench_model_device.sh);
#  4. runs test_hf_parity_vl (kiln generate on the CPU vs HF), test_cuda_model_vl, and, once step 1 is done,
#     test_cuda_model_hf4b with KILN_HF4B_DIR; prints a summary. Logs and hf4b_reference.json go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/kiln-out}}
hf4b=${HF4B_DIR:-/tmp/hf4b}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
# One GEMM tactic cache for this machine's calls (bench/bench_model_device.sh uses the same default).
export KILN_TUNE_CACHE=${KILN_TUNE_CACHE:-/tmp/kiln-gemm-tactics.txt}
t0=$(date +%s)
el() { echo "$(($(date +%s) - t0)) s"; }
summary=()

python3 tests/fixtures/make_hf_4b_reference.py --out "$hf4b" >"$out/make_hf_4b.log" 2>&1 &
pid4b=$!

python3 tests/fixtures/make_hf_vl_fixture.py --out tests/fixtures/hf >"$out/make_hf_vl.log" 2>&1
vl_rc=$?
summary+=("make_hf_vl_fixture rc=$vl_rc ($(el)): $(tail -1 "$out/make_hf_vl.log")")
targets=(kiln test_cuda_model_vl test_cuda_model_hf4b)
if ((vl_rc == 0)); then
  tar czf "$out/qwen3_vl_tiny.tgz" -C tests/fixtures/hf qwen3_vl_tiny  # one file: the device tool returns 8
  targets+=(test_hf_parity_vl)
fi

bash scripts/device_build.sh "${targets[@]}" >"$out/build.log" 2>&1
build_rc=$?
summary+=("build rc=$build_rc ($(el))")
if ((build_rc != 0)); then
  grep -B2 -A12 -m3 "FAILED\|error" "$out/build.log" | head -60
fi

bd=build/device/tests
run_test() {  # NAME [env assignments...]: runs $bd/NAME, logs to $out/NAME.log
  local name=$1
  shift
  if [[ ! -x $bd/$name ]]; then
    summary+=("$name: not built")
    return
  fi
  env "$@" "$bd/$name" >"$out/$name.log" 2>&1
  local rc=$?
  summary+=("$name rc=$rc ($(el)): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')")
}
if ((vl_rc == 0)); then run_test test_hf_parity_vl; fi
run_test test_cuda_model_vl

wait $pid4b
rc4b=$?
last4b=$(grep -E '^\{' "$out/make_hf_4b.log" | tail -1 | cut -c1-600)
summary+=("make_hf_4b_reference rc=$rc4b ($(el)): $last4b")
if ((rc4b == 0)); then
  cp "$hf4b/hf_reference.json" "$out/hf4b_reference.json"
  run_test test_cuda_model_hf4b KILN_HF4B_DIR="$hf4b"
fi

echo "---- summary ($(el))"
for s in "${summary[@]}"; do echo "$s"; done
echo "---- tables"
grep -hE "^hf4b " "$out/test_cuda_model_hf4b.log" 2>/dev/null
grep -hE "^cuda " "$out/test_cuda_model_vl.log" 2>/dev/null
grep -hE "^  qwen3_vl_tiny" "$out/test_hf_parity_vl.log" 2>/dev/null
grep -hE "^  length " "$out/make_hf_4b.log" 2>/dev/null
echo "---- failures"
((vl_rc == 0)) || tail -15 "$out/make_hf_vl.log"
((rc4b == 0)) || tail -15 "$out/make_hf_4b.log"
grep -hE "Failure|Expected|Which is|error:" "$out"/test_*.log 2>/dev/null | head -40
