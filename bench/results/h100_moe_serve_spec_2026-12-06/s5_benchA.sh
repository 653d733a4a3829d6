#!/usr/bin/env bash
# After the tests: the serving part of moe-serve while the call has time (cut 10 s before its end).
set -u
left=$(( ${BUDGET:-585} - ($(date +%s) - ${CALL_T0}) ))
echo "## moe-serve (left $left s)"
(( left > 90 )) || { echo "## SKIP moe-serve"; exit 0; }
MODEL_ROWS=0 MOE_SECONDS=100 timeout $(( left - 10 )) bash bench/device.sh moe-serve 2>&1 | tail -25
