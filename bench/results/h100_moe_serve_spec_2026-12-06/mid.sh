#!/usr/bin/env bash
# Mid call: build everything, every helper branch's GPU tests, then short benches while time is left.
set -u
t0=$(date +%s); export CALL_T0=$t0; el() { echo $(( $(date +%s) - t0 )); }
left() { echo $(( ${BUDGET:-585} - $(el) )); }
B=build/device; K=$B/bin/kiln
bash scripts/device_build.sh > "$OUT/build.txt" 2>&1 || { tail -60 "$OUT/build.txt"; exit 1; }
echo "build $(el) s; $(nvidia-smi --query-gpu=name --format=csv,noheader)"
T="$OUT/tests.txt"; : > "$T"; cp "$OUT/build.txt" /dev/null
for t in $(cat "${TESTS_FILE:-.carry/tests.txt}"); do
  (( $(left) > 20 )) || { echo "== $t SKIPPED (time)" >> "$T"; continue; }
  [[ -x $B/tests/$t ]] || { echo "== $t MISSING" >> "$T"; continue; }
  s=$(el); case $t in test_engine_demo) f=--gtest_filter=EngineQwen3.Cuda*;; *) f=;; esac; timeout $(( $(left) < 120 ? $(left) : 120 )) $B/tests/$t $f --gtest_brief=1 > /tmp/$t.log 2>&1; rc=$?
  echo "== $t rc=$rc $(( $(el) - s )) s" >> "$T"; grep -v '^kiln: \|^\[ *OK\|^\[ RUN' /tmp/$t.log | tail -40 >> "$T"
  echo "$t rc=$rc ($(el) s)"
done
echo "tests done $(el) s"
[[ -n ${BENCH_FILE:-} ]] && bash "$BENCH_FILE" 2>&1 | tee "$OUT/bench.txt" | tail -100
echo "all $(el) s"
