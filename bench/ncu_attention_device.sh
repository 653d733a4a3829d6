#!/usr/bin/env bash
# Nsight Compute on the attention kernels that miss their targets (GPU machine, after a build): prefill v4
# (bf16, 4096 tokens), decode v3 (bf16 and fp8, B=128 ctx 9216) and, beside them, cuDNN's bf16 decode of the same
# shape, one launch each, the sections that say where the time goes (throughput, pipes, warp stalls,
# instruction mix) and the L2's sector counters. The last table compares the sectors the SMs ask of the L2
# with the DRAM bytes: a kernel that reads each byte once asks for dram_bytes / 32 sectors, all of them misses;
# more means some bytes come through the L2 twice (the fifteenth session found the decode tensor maps' 256-byte
# L2 promotion this way: docs/PERF.md). Usage: OUT=DIR bench/ncu_attention_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kiln-out}
K=${KILN:-build/device/bin/kiln}
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
  --section Occupancy --section WarpStateStats --section InstructionStats --section LaunchStats
  --metrics dram__bytes_read.sum,lts__t_sectors_srcunit_tex.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,lts__t_sectors_srcunit_ltcfabric.sum)
decode="B=128 ctx=9216 table=10240 32/8 D128 page32 HND"
profile() {  # NAME KERNEL_REGEX BENCH_ONLY FILTER [LAUNCH_SKIP]
  KILN_ATTN_BENCH_ONLY="$3" timeout 150 ncu --clock-control none -k "regex:$2" --launch-skip "${5:-3}" -c 1 \
    "${sections[@]}" "$K" bench kernels --filter "$4" >"$out/ncu_$1.txt" 2>&1
  echo "ncu $1 rc=$?"
}
profile prefill_v4 prefill_v4_kernel "ctx=4096 q_len=4096 table=5120 32/8 D128 page32 HND bf16" =attention
profile decode_bf16 decode_kernel_v3 "$decode bf16" =attention
profile decode_fp8 decode_kernel_v3 "$decode fp8" =attention
# cuDNN's paged form on the same pages (its first launch: the validation run on the same inputs).
profile cudnn_decode_bf16 "sdpa|fmha|flash|cudnn|fprop" "B=128 ctx=9216 32/8 D128 bf16 page32" =attention_cudnn 0
printf '%-18s %10s %14s %14s %14s %14s\n' kernel "time us" "DRAM read GB" "L2 sectors" "of them misses" \
  "crossing"
for n in prefill_v4 decode_bf16 decode_fp8 cudnn_decode_bf16; do
  awk -v n="$n" '
    $1 == "Duration" { t = $3; if ($2 == "ms") t *= 1000 }
    $1 == "dram__bytes_read.sum" { g = $3; if ($2 == "Mbyte") g /= 1000 }
    $1 == "lts__t_sectors_srcunit_tex.sum" { s = $3 }
    $1 == "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum" { m = $3 }
    $1 == "lts__t_sectors_srcunit_ltcfabric.sum" { f = $3 }
    END { printf "%-18s %10s %14s %14s %14s %14s\n", n, t, g, s, m, f }' "$out/ncu_$n.txt"
done
