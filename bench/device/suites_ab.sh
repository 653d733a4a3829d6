# bench/device.sh's `ab` suite: this tree against other builds on one machine, rounds alternating (sourced).
# shellcheck shell=bash disable=SC2154  # here, suite, rows, W, K, BD: set by device.sh and lib.sh

# Other trees: .ab/NAME.tar.gz made here (git archive --format=tar COMMIT -- . ':!tests/fixtures'
# ':!bench/results' | gzip > .ab/base.tar.gz; /.ab/ in .git/info/exclude; carry .ab), each unpacked into
# /tmp/kiln-NAME and built with this tree's sysroot. FLAGS="-D..." (and FLAGS2) add this tree built again with
# those nvcc flags (build/device-flags, -flags2): an experiment behind a compile-time switch. All builds run at
# once. Then `kiln $CMD` (default "bench kernels --filter =attention") with each binary in turn, ROUNDS times
# (default 2) alternating, under ENV ("A=1;B=2": assignments separated by ';'), so a drift of the machine
# shows as spread, not as a difference. TESTS=1 runs test_cuda_attention with this tree's builds first.
# PROFILE=1 adds ncu's per-instruction stall samples of the Hopper prefill kernel (bf16, 4096 tokens) as CSV
# (python3 bench/ncu_source_top.py prefill_source.csv 30 reads it).
suite_ab() {
  need_gpu || return
  local names=() tb n d fv targets=(kiln)
  [[ ${TESTS:-0} == 1 ]] && targets+=(test_cuda_attention)
  for tb in .ab/*.tar.gz; do
    [[ -f $tb ]] || continue
    n=$(basename "$tb" .tar.gz)
    d=/tmp/kiln-$n
    if ! { rm -rf "$d" && mkdir -p "$d/.deps" && tar -xzf "$tb" -C "$d" && ln -s "$PWD/.deps/sysroot" "$d/.deps/sysroot"; }
    then
      row "unpack $n" "FAILED"
      continue
    fi
    names+=("$n")
    (cd "$d" && bash scripts/device_build.sh kiln >"$W/ab/build_$n.log" 2>&1) &
  done
  (KILN_BUILD_DIR=$BD bash scripts/device_build.sh "${targets[@]}" >"$W/ab/build_new.log" 2>&1) &
  for fv in FLAGS FLAGS2; do
    [[ -n ${!fv:-} ]] || continue
    n=${fv,,}
    names+=("$n")
    (KILN_BUILD_DIR=build/device-$n KILN_CUDA_FLAGS="${!fv}" bash scripts/device_build.sh "${targets[@]}" \
      >"$W/ab/build_$n.log" 2>&1) &
  done
  wait
  row "builds" "${names[*]} new"
  local bd
  if [[ ${TESTS:-0} == 1 ]]; then
    for bd in "$BD" ${FLAGS:+build/device-flags} ${FLAGS2:+build/device-flags2}; do
      timeout 300 "$bd/tests/test_cuda_attention" --gtest_brief=1 >"$W/ab/tests_${bd##*/}.log" 2>&1
      row "$bd test_cuda_attention" "rc=$? $(gtest_counts "$W/ab/tests_${bd##*/}.log")"
    done
  fi
  local cmd=() envs=() r which bin
  read -r -a cmd <<<"${CMD:-bench kernels --filter =attention}"
  IFS=';' read -r -a envs <<<"${ENV:-}"
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for which in "${names[@]}" new; do
      case $which in
        new) bin=$BD/bin/kiln ;;
        flags | flags2) bin=build/device-$which/bin/kiln ;;
        *) bin=/tmp/kiln-$which/build/device/bin/kiln ;;
      esac
      echo "==== round $r $which" >>"$W/ab/ab.txt"
      env "${envs[@]}" timeout 200 "$bin" "${cmd[@]}" >>"$W/ab/ab.txt" 2>&1
      row "round $r $which" "rc=$?"
    done
  done
  grep -E "^====|^\| attention \|" "$W/ab/ab.txt" | awk -F'|' '/====/ {print; next} {print $3 "|" $4 "|" $6}' |
    cut -c1-150
  if [[ ${PROFILE:-0} == 1 ]]; then
    KILN_ATTN_BENCH_KERNELS="prefill v4" KILN_ATTN_BENCH_ONLY="ctx=4096 q_len=4096 table=5120 32/8 D128 page32 HND bf16" \
      timeout 200 ncu --clock-control none -k regex:prefill_sm90_kernel --launch-skip 3 -c 1 --set full \
      --import-source no -o "$S/prefill" "$BD/bin/kiln" bench kernels --filter =attention >"$W/ab/ncu_run.log" 2>&1
    row "ncu prefill (full set)" "rc=$?"
    ncu -i "$S/prefill.ncu-rep" --page source --csv --print-source sass >"$W/ab/prefill_source.csv" 2>&1
    ncu -i "$S/prefill.ncu-rep" --page details >"$W/ab/prefill_details.txt" 2>&1
    python3 bench/ncu_source_top.py "$W/ab/prefill_source.csv" 30 2>&1 | head -40
  fi
}
