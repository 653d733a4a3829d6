#!/usr/bin/env bash
# The order of prefill v4's synchronisation and math in its SASS (GPU machine or anywhere cuobjdump runs, after a
# build): the overlapped bf16 D128 kernel's HGMMA, WARPGROUP.DEPBAR, MUFU, F2FP, SYNCS (mbarrier) and BAR
# instructions, run-length compressed, other instructions left out. It shows where ptxas put the wait for
# P_{j-1} V_{j-1} (`DEPBAR.LE gsb0, 0x0`) against the softmax's exponentials (MUFU): the source has it after
# them, and through the twenty-first session ptxas put it before them (docs/PERF.md).
# Usage: bench/prefill_v4_sass_order.sh [BUILD_DIR]   (default build/device)
set -euo pipefail
cd "$(dirname "$0")/.."
obj=$(find "${1:-build/device}" -name "attention_prefill_v4_d128.cu.o" | head -1)
[[ -n $obj ]] || { echo "no attention_prefill_v4_d128.cu.o under ${1:-build/device}: build kiln first"; exit 1; }
fun='_ZN4kiln4cuda2v417prefill_v4_kernelILi128ELNS0_7KvDtypeE0ELb1EEEvNS0_15PrefillV4ParamsE'
"${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump" -sass -fun "$fun" "$obj" |
  grep -E '^\s+/\*[0-9a-f]+\*/' | sed -E 's/^\s+\/\*[0-9a-f]+\*\/\s+//; s/ ;.*//' |
  awk '{ op = ($1 ~ /^@/) ? $2 : $1; split(op, a, "."); k = a[1]; n++
         if (op ~ /^WARPGROUP.DEPBAR/) t = $0
         else if (k == "HGMMA" || k == "MUFU" || k == "F2FP" || k == "SYNCS" || k == "BAR") t = k
         else next
         if (t == prev) { c++ } else { if (prev != "") printf "%s x%d\n", prev, c; prev = t; c = 1 } }
       END { if (prev != "") printf "%s x%d\n", prev, c; print "instructions", n }'
