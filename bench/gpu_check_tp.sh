#!/usr/bin/env bash
# One GPU-machine call for issue 14 (tensor parallelism) on one H200: builds kiln and the TP tests, runs the
# one-rank NCCL TP path against the non-TP runner (bitwise, eager and in graphs with the collectives inside),
# the NCCL communicator test, the CPU TP tests, and times Qwen3-4B-shape decode through the TP path (--tp 1:
# every NCCL all-reduce / all-gather inside the graph) beside the plain runner. Carry .deps/sysroot. ~4 min.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
export KILN_TUNE_CACHE=/tmp/kiln-gemm-tactics.txt
t0=$(date +%s); el() { echo "t=$(($(date +%s)-t0))"; }
bash scripts/device_build.sh kiln test_tp_cuda test_nccl_comm test_tp > $OUT/build.log 2>&1 ||
  { grep -m5 -B3 -A12 "error" $OUT/build.log; exit 1; }
grep -h "kiln: NCCL" build/device-configure.log
echo "build ok $(el)"
for t in test_tp_cuda test_nccl_comm test_tp; do
  timeout 300 build/device/tests/$t > $OUT/$t.log 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' $OUT/$t.log | tr '\n' ' ') $(el)"
  grep -E "NCCL (refuses|accepted)|Failure" -A6 $OUT/$t.log | head -20
done
k=build/device/bin/kiln
python3 scripts/make_yarn_4b_config.py /tmp/q4b > /dev/null
timeout 200 $k bench model --shape qwen3-4b --context 1024 --steps 64 --no-breakdown > $OUT/bench_plain.log 2>&1
echo "plain: $(grep -E 'TPOT.*(eager|CUDA graph\))' $OUT/bench_plain.log | cut -c1-110 | tr '\n' '|')"
timeout 200 $k bench model --model /tmp/q4b --tp 1 --context 1024 --steps 64 > $OUT/bench_tp1.log 2>&1
echo "tp 1 (NCCL path): $(grep 'tensor parallelism' $OUT/bench_tp1.log)"
el
