#!/usr/bin/env bash
# The current tree against an older one in one GPU-machine call (device tool; carry .deps/sysroot and
# .ab/base.tar.gz, a `git archive` of the older commit made here: git archive --format=tar COMMIT | gzip >
# .ab/base.tar.gz, with /.ab/ in .git/info/exclude). Builds kiln in this tree (build/device) and in the
# unpacked base (/tmp/kiln-base, this tree's sysroot), then runs `kiln $CMD` with each binary in turn,
# ROUNDS times alternating (so drift between machines' clocks or over the run shows as spread, not as a
# difference), with the environment assignments of ENV. PROFILE=1 adds ncu's per-SASS-instruction warp-stall
# samples of prefill v4 (bf16, 4096 tokens) of the current build, as CSV for reading here.
# Usage: CMD="bench kernels --filter =attention" ENV="KILN_ATTN_BENCH_KERNELS=prefill v4" bench/ab_tree_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
t0=$(date +%s)
base=/tmp/kiln-base
rm -rf "$base" && mkdir -p "$base/.deps" && tar -xzf .ab/base.tar.gz -C "$base" && ln -s "$PWD/.deps/sysroot" "$base/.deps/sysroot" ||
  { echo "no base tree (.ab/base.tar.gz)"; exit 1; }
(bash scripts/device_build.sh kiln >"$out/build_new.log" 2>&1; echo "new build rc=$?") &
(cd "$base" && bash scripts/device_build.sh kiln >"$out/build_base.log" 2>&1; echo "base build rc=$?") &
wait
echo "builds: $(($(date +%s) - t0)) s"
read -r -a cmd <<<"${CMD:-bench kernels --filter =attention}"
IFS=';' read -r -a envs <<<"${ENV:-}"
log="$out/ab.log"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for which in base new; do
    bin=build/device/bin/kiln
    [[ $which == base ]] && bin=$base/build/device/bin/kiln
    echo "==== round $r $which" >>"$log"
    env "${envs[@]}" timeout 200 "$bin" "${cmd[@]}" >>"$log" 2>&1
    echo "round $r $which rc=$? ($(($(date +%s) - t0)) s)"
  done
done
if [[ ${PROFILE:-0} == 1 ]]; then
  KILN_ATTN_BENCH_KERNELS="prefill v4" KILN_ATTN_BENCH_ONLY="ctx=4096 q_len=4096 table=5120 32/8 D128 page32 HND bf16" \
    timeout 200 ncu --clock-control none -k regex:prefill_v4_kernel --launch-skip 3 -c 1 --set full \
    --import-source no -o /tmp/v4prof build/device/bin/kiln bench kernels --filter =attention >"$out/ncu_run.log" 2>&1
  echo "ncu rc=$?"
  ncu -i /tmp/v4prof.ncu-rep --page source --csv --print-source sass >"$out/prefill_v4_source.csv" 2>&1
  echo "source page rc=$? ($(wc -l <"$out/prefill_v4_source.csv") lines)"
  ncu -i /tmp/v4prof.ncu-rep --page details >"$out/prefill_v4_details.txt" 2>&1
fi
echo "---- ($(($(date +%s) - t0)) s)"
grep -E "^====|^\| attention \|" "$log" | awk -F'|' '/====/ {print; next} {print $3 "|" $4 "|" $6}' | cut -c1-150
