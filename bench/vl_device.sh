#!/usr/bin/env bash
# The Qwen3-VL image path in one GPU-machine call (device tool, carry .deps/sysroot):
#     bash bench/vl_device.sh [OUT]     (OUT: the argument, else $OUT)
#  1. generates the image parity fixture tests/fixtures/hf/qwen3_vl_image_tiny (make_hf_vl_image_fixture.py,
#     CPU, ~1 min) and packs it into $OUT/qwen3_vl_image_tiny.tgz (unpack it into tests/fixtures/hf and commit);
#  2. builds kiln and the VL tests with scripts/device_build.sh in build/device;
#  3. runs test_hf_parity_vl_image (the CPU engine vs transformers, on the fresh fixture), test_engine_vl,
#     test_ops_vision, test_cuda_vision (CUDA vs CPU: ops, towers, the engine with images);
#  4. times the Qwen3-VL-4B-shaped vision tower: kiln bench vision --device cuda (448x448, 1024x1024,
#     1920x1080). Logs to $OUT; a summary at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/kiln-out}}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
export KILN_TUNE_CACHE=${KILN_TUNE_CACHE:-/tmp/kiln-gemm-tactics.txt}
t0=$(date +%s)
el() { echo "$(($(date +%s) - t0)) s"; }
summary=()

python3 tests/fixtures/make_hf_vl_image_fixture.py --out tests/fixtures/hf >"$out/make_hf_vl_image.log" 2>&1
fx_rc=$?
summary+=("make_hf_vl_image_fixture rc=$fx_rc ($(el)): $(tail -1 "$out/make_hf_vl_image.log" | cut -c1-600)")
((fx_rc == 0)) && tar czf "$out/qwen3_vl_image_tiny.tgz" -C tests/fixtures/hf qwen3_vl_image_tiny

targets=(kiln test_hf_parity_vl_image test_engine_vl test_ops_vision test_cuda_vision test_cuda_vision_varlen)
bash scripts/device_build.sh "${targets[@]}" >"$out/build.log" 2>&1
build_rc=$?
summary+=("build rc=$build_rc ($(el))")
((build_rc == 0)) || grep -B2 -A12 -m3 "FAILED\|error" "$out/build.log" | head -60

bd=build/device/tests
for name in test_hf_parity_vl_image test_engine_vl test_ops_vision test_cuda_vision test_cuda_vision_varlen; do
  if [[ ! -x $bd/$name ]]; then
    summary+=("$name: not built")
    continue
  fi
  "$bd/$name" >"$out/$name.log" 2>&1
  summary+=("$name rc=$? ($(el)): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')")
done
if [[ -x build/device/bin/kiln ]]; then
  build/device/bin/kiln bench vision --device cuda --shape 4b --runs 5 >"$out/bench_vision.log" 2>&1
  summary+=("bench vision rc=$? ($(el))")
fi

echo "---- summary ($(el))"
for s in "${summary[@]}"; do echo "$s"; done
echo "---- tables"
grep -hE "^  (vision|deepstack|[0-9] image)" "$out/test_hf_parity_vl_image.log" 2>/dev/null
cat "$out/bench_vision.log" 2>/dev/null
echo "---- failures"
((fx_rc == 0)) || tail -15 "$out/make_hf_vl_image.log"
grep -hE "Failure|Expected|Which is|error:|actual" "$out"/test_*.log 2>/dev/null | head -40
