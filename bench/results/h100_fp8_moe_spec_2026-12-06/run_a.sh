#!/usr/bin/env bash
# Run from the repository root on the GPU machine with .deps carried (docs/BENCH.md); .carry/commit names the commit.
# Final run, part A: build, every GPU test, fixtures made by torch/transformers, the kernel benches. Logs in $OUT.
set -u
export KILN_COMMIT=$(cat .carry/commit)
K=build/device/bin/kiln
t0=$(date +%s)
bash bench/device.sh build tests > "$OUT/tests.txt" 2>&1
echo "tests $(( $(date +%s) - t0 )) s"
{
  KILN_BUILD_DIR=build/device bash scripts/device_build.sh test_eagle3_draft test_server_rerank_hf > /tmp/b2.log 2>&1 || tail -20 /tmp/b2.log
  timeout 60 python3 scripts/make_eagle3_fixture.py /tmp/e3fix 2>&1 | tail -2
  KILN_EAGLE3_FIXTURE=/tmp/e3fix timeout 60 build/device/tests/test_eagle3_draft 2>&1 | grep -E "OK|FAIL|PASSED|Failure" | head
  timeout 90 python3 scripts/make_reranker_fixture.py --out /tmp/rr --tar "$OUT/qwen3_reranker_tiny.tgz" 2>&1 | tail -2
  mkdir -p tests/fixtures/hf && tar -xzf "$OUT/qwen3_reranker_tiny.tgz" -C tests/fixtures/hf && timeout 60 build/device/tests/test_server_rerank_hf 2>&1 | grep -E "OK|FAIL|PASSED|Failure|SKIP" | head
} > "$OUT/fixtures.txt" 2>&1
echo "fixtures $(( $(date +%s) - t0 )) s"
KILN_BUILD_DIR=build/device bash scripts/device_build.sh kiln > /tmp/bk.log 2>&1 || tail -30 /tmp/bk.log
timeout 150 $K bench kernels --filter =fp8_gemm > "$OUT/fp8_gemm_bench.txt" 2>&1
echo "fp8_gemm bench $(( $(date +%s) - t0 )) s"
{ timeout 60 $K bench kernels --filter =gemv_fp8; timeout 90 $K bench kernels --filter moe; } > "$OUT/gemv_moe_bench.txt" 2>&1
echo "all $(( $(date +%s) - t0 )) s"
grep -E "^\| tests " "$OUT/tests.txt" | grep -v "rc=0"; grep -c "rc=0" "$OUT/tests.txt"; cat "$OUT/fixtures.txt"
