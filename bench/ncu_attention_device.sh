#!/usr/bin/env bash
# Nsight Compute on the two attention kernels that miss their targets (GPU machine, after a build): prefill v4
# (bf16, 4096 tokens) and decode v3 (fp8, B=128 ctx 9216), one launch each, the sections that say where the time
# goes (throughput, pipes, warp stalls, instruction mix). Usage: OUT=DIR bench/ncu_attention_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kiln-out}
K=${KILN:-build/device/bin/kiln}
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
  --section Occupancy --section WarpStateStats --section InstructionStats --section LaunchStats)
KILN_ATTN_BENCH_ONLY="ctx=4096 q_len=4096 table=5120 32/8 D128 page32 HND bf16" timeout 150 \
  ncu --clock-control none -k regex:prefill_v4_kernel --launch-skip 3 -c 1 "${sections[@]}" \
  $K bench kernels --filter attention >"$out/ncu_prefill_v4.txt" 2>&1
echo "ncu prefill v4 rc=$?"
KILN_ATTN_BENCH_ONLY="B=128 ctx=9216 table=10240 32/8 D128 page32 HND fp8" timeout 150 \
  ncu --clock-control none -k regex:decode_kernel_v3 --launch-skip 3 -c 1 "${sections[@]}" \
  $K bench kernels --filter attention >"$out/ncu_decode_fp8.txt" 2>&1
echo "ncu decode fp8 rc=$?"
