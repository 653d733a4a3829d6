#!/usr/bin/env bash
# The current tree against other trees in one GPU-machine call (device tool; carry .deps/sysroot and .ab,
# which holds NAME.tar.gz tarballs of the other trees made here, e.g. git archive --format=tar COMMIT -- .
# ':!tests/fixtures' ':!bench/results' | gzip > .ab/base.tar.gz, with /.ab/ in .git/info/exclude). Builds
# kiln in this tree (build/device) and in each unpacked tree (/tmp/kiln-NAME, this tree's sysroot) at once,
# then runs `kiln $CMD` with each binary in turn,
# ROUNDS times alternating (so drift between machines' clocks or over the run shows as spread, not as a
# difference), with the environment assignments of ENV. PROFILE=1 adds ncu's per-SASS-instruction warp-stall
# samples of prefill v4 (bf16, 4096 tokens) of the current build, as CSV for reading here. FLAGS="-D..." adds
# this tree built a second time with those nvcc flags (build/device-flags, named "flags"; an experiment behind
# a compile-time switch, e.g. bench/experiments/prefill_v4_k_stages.patch); with TESTS=1 its tests run too.
# FLAGS2 adds a third build of this tree the same way (build/device-flags2, named "flags2").
# Usage: CMD="bench kernels --filter =attention" ENV="KILN_ATTN_BENCH_KERNELS=prefill v4" bench/ab_tree_device.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
t0=$(date +%s)
names=()
for tb in .ab/*.tar.gz; do
  n=$(basename "$tb" .tar.gz)
  d=/tmp/kiln-$n
  rm -rf "$d" && mkdir -p "$d/.deps" && tar -xzf "$tb" -C "$d" && ln -s "$PWD/.deps/sysroot" "$d/.deps/sysroot" || continue
  names+=("$n")
  (cd "$d" && bash scripts/device_build.sh kiln >"$out/build_$n.log" 2>&1; echo "$n build rc=$?") &
done
targets=(kiln)
[[ ${TESTS:-0} == 1 ]] && targets+=(test_cuda_attention)
(bash scripts/device_build.sh "${targets[@]}" >"$out/build_new.log" 2>&1; echo "new build rc=$?") &
for fv in FLAGS FLAGS2; do
  [[ -n ${!fv:-} ]] || continue
  n=$(tr 'A-Z' 'a-z' <<<"$fv")
  names+=("$n")
  (KILN_BUILD_DIR=build/device-$n KILN_CUDA_FLAGS="${!fv}" bash scripts/device_build.sh "${targets[@]}" \
    >"$out/build_$n.log" 2>&1; echo "$n build (${!fv}) rc=$?") &
done
wait
echo "builds: $(($(date +%s) - t0)) s"
if [[ ${TESTS:-0} == 1 ]]; then  # TESTS=1: the current tree's attention tests first (and the flags build's)
  for bd in build/device ${FLAGS:+build/device-flags} ${FLAGS2:+build/device-flags2}; do
    timeout 300 $bd/tests/test_cuda_attention --gtest_brief=1 >"$out/tests_${bd##*/}.log" 2>&1
    echo "$bd test_cuda_attention rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$out/tests_${bd##*/}.log" | tr '\n' ' ') ($(($(date +%s) - t0)) s)"
  done
fi
read -r -a cmd <<<"${CMD:-bench kernels --filter =attention}"
IFS=';' read -r -a envs <<<"${ENV:-}"
log="$out/ab.log"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for which in "${names[@]}" new; do
    case $which in
      new) bin=build/device/bin/kiln ;;
      flags | flags2) bin=build/device-$which/bin/kiln ;;
      *) bin=/tmp/kiln-$which/build/device/bin/kiln ;;
    esac
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
