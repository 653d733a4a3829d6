# bench/device.sh's shared state and helpers (sourced): the work folder, the summary table, the build, the GPU
# check, running a test binary, and what goes back in $OUT.
# shellcheck shell=bash

export PATH=/usr/local/cuda/bin:$PATH
export KILN_TUNE_CACHE=${KILN_TUNE_CACHE:-/tmp/kiln-gemm-tactics.txt}
OUT=${OUT:-/tmp/kiln-out}
BD=${BD:-build/device}    # the shared build folder (scripts/device_build.sh's default)
K=${KILN:-$BD/bin/kiln}   # KILN: another kiln binary (a CPU dry run of a serving suite: build/cpu/bin/kiln)
W=${WORK:-/tmp/kiln-device}  # every log; packed into $OUT/logs.tgz at the end
S=${SCRATCH:-/tmp/kiln-device-scratch}  # models, profiles, tarballs: not packed (too large to bring back)
rows=()                   # the summary table: suite, what, result, seconds (tab-separated)
kept=()                   # files for $OUT besides summary.txt and logs.tgz (at most 5)
t_start=$(date +%s)
t_suite=$t_start
suite=

# dev_start: fresh work folder, the machine in one line.
dev_start() {
  mkdir -p "$OUT"
  rm -rf "$W" "$S" && mkdir -p "$W" "$S"
  if have_gpu; then
    gpu_name=$(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader 2>/dev/null |
      head -1)
  else
    gpu_name="no GPU visible (nvidia-smi found none): GPU suites are skipped"
  fi
  echo "device.sh: $gpu_name; commit ${KILN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo "?")}; tactics $KILN_TUNE_CACHE"
  echo "$gpu_name" >"$W/device.txt"
}

# dev_section NAME: a suite starts (its logs go to $W/NAME/).
dev_section() {
  suite=$1
  t_suite=$(date +%s)
  mkdir -p "$W/$suite"
  echo "---- $suite (t=$(($(date +%s) - t_start)) s)"
}

# row WHAT RESULT: one line of the summary table, also printed now (a call cut off at its limit still shows it).
row() {
  local line="$suite"$'\t'"${1//$'\t'/ }"$'\t'"${2//$'\t'/ }"$'\t'"$(($(date +%s) - t_suite))"
  rows+=("$line")
  echo "  $1: $2"
}

# keep FILE: copy FILE into $OUT (at most 5 such files; past that the file stays where it is, said so).
keep() {
  if ((${#kept[@]} >= 5)); then
    echo "  (not copied to \$OUT, more than 5 kept files: $1 stays on the machine)"
    return
  fi
  cp "$1" "$OUT/" && kept+=("$(basename "$1")")
}

# past_deadline: true once DEADLINE seconds (where set) have passed since the start.
past_deadline() { [[ -n ${DEADLINE:-} ]] && (($(date +%s) - t_start > DEADLINE)); }

have_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

# need_gpu: false (and a "skipped" row) where no GPU is visible.
need_gpu() {
  have_gpu && return 0
  row "$suite" "SKIPPED: no GPU visible"
  return 1
}

# build TARGET...: incremental build of those targets in $BD (ninja: free when nothing changed). False, with
# the first errors printed, when it fails. KILN set: nothing to build (that binary is used as is).
build() {
  [[ -n ${KILN:-} && $* == kiln ]] && return 0
  local log="$W/build.log"
  echo "==== $(date +%T) targets: $*" >>"$log"
  # BUILD_NICE (set where trainings run beside the build): the compilers yield the CPU to the training loops.
  if ! KILN_BUILD_DIR=$BD nice -n "${BUILD_NICE:-0}" bash scripts/device_build.sh "$@" >>"$log" 2>&1; then
    grep -m5 -B2 -A12 "FAILED\|error" "$log" | head -60
    row "build" "FAILED ($*): see build.log"
    return 1
  fi
}

# gpu_tests: the GPU test binaries ($ONLY_TESTS where set; else tests/cuda, with the 4B parity test left to `parity`), then the CPU-folder
# tests that drive the engine or the towers on CUDA.
gpu_tests() {
  local f t
  if [[ -n ${ONLY_TESTS:-} ]]; then  # ONLY_TESTS="a b": only those binaries (a short call that checks a few)
    tr ' ' '\n' <<<"$ONLY_TESTS" | sed '/^$/d'
    return
  fi
  for f in tests/cuda/test_*.cpp tests/cuda/test_*.cu; do
    t=$(basename "${f%.*}")
    [[ $t == test_cuda_model_hf4b ]] || echo "$t"
  done
  for t in test_engine_demo test_engine_overlap test_engine_vl test_hf_parity_vl_image test_ops_vision test_tp; do
    [[ -f tests/unit/$t.cpp ]] && echo "$t"
  done
}

# gtest_counts LOG: gtest's PASSED / FAILED / SKIPPED lines on one line.
gtest_counts() { grep -hE '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$1" | tr -s ' ' | tr '\n' ' '; }

# run_test NAME [--gtest args] [-- ENV=VALUE...]: $BD/tests/NAME to $W/$suite/NAME.log, one summary row.
run_test() {
  local name=$1 args=() envs=()
  shift
  while (($#)); do
    if [[ $1 == -- ]]; then
      shift
      envs=("$@")
      break
    fi
    args+=("$1")
    shift
  done
  local bin=$BD/tests/$name log=$W/$suite/$name.log
  if [[ ! -x $bin ]]; then
    row "$name" "not built"
    return 1
  fi
  env "${envs[@]}" timeout "${TEST_TIMEOUT:-400}" "$bin" --gtest_brief=1 "${args[@]}" >"$log" 2>&1
  local rc=$?
  row "$name" "rc=$rc $(gtest_counts "$log")"
  ((rc == 0)) || grep -hE -B2 -A8 "Failure" "$log" | head -20
  return $rc
}

# tune SHAPE MAX_TOKENS MAX_LOGIT_ROWS [FLAGS...]: fill the tactic cache for a shape (once per machine and shape;
# FLAGS: more `kiln tune` flags, e.g. --quantization fp8 for the FP8 GEMV and GEMM shapes).
tune() {
  "$K" tune --shape "$1" --max-tokens "$2" --max-logit-rows "$3" "${@:4}" >>"$W/$suite/tune.log" 2>&1 ||
    row "tune $1 ${*:4}" "FAILED: see $suite/tune.log"
}

# verdict VALUE <=|>= TARGET: met, missed, or n/a where VALUE is not a number (bench/device/figures.py).
# shellcheck disable=SC2154  # here: set by device.sh
verdict() { python3 "$here/figures.py" verdict "$@"; }

# make_fixture SCRIPT OUT_DIR TARBALL GLOB: python3 tests/fixtures/SCRIPT.py --out OUT_DIR (log
# $W/$suite/SCRIPT.log; a row: its exit status and last line); where it succeeded, the folders of OUT_DIR that
# GLOB matches are packed into $S/TARBALL (the fixture to unpack into tests/fixtures/hf and commit) and kept in
# $OUT. Returns the script's exit status.
make_fixture() {
  local script=$1 dir=$2 tarball=$3 glob=$4 log="$W/$suite/$1.log" rc fx=()
  python3 "tests/fixtures/$script.py" --out "$dir" >"$log" 2>&1
  rc=$?
  row "$script" "rc=$rc $(tail -1 "$log" | cut -c1-120)"
  ((rc == 0)) || return $rc
  mapfile -t fx < <(cd "$dir" && compgen -G "$glob")
  ((${#fx[@]})) && tar czf "$S/$tarball" -C "$dir" "${fx[@]}" && keep "$S/$tarball"
  return 0
}

# dev_finish: the summary table last, then summary.txt and logs.tgz in $OUT.
dev_finish() {
  local total=$(($(date +%s) - t_start)) r
  {
    echo "==== summary ($total s; $(cat "$W/device.txt"); logs: \$OUT/logs.tgz)"
    printf '| %-10s | %-44s | %-5s | %s\n' suite what "s" result
    printf '| %-10s | %-44s | %-5s | %s\n' ---------- -------------------------------------------- ----- ------
    for r in "${rows[@]}"; do
      IFS=$'\t' read -r s what result secs <<<"$r"
      printf '| %-10s | %-44s | %-5s | %s\n' "$s" "${what:0:44}" "$secs" "$result"
    done
  } >"$W/summary.txt"
  tar czf "$OUT/logs.tgz" -C "$W" . 2>/dev/null
  cp "$W/summary.txt" "$OUT/summary.txt"
  echo
  cat "$W/summary.txt"
  ((${#kept[@]})) && echo "kept in \$OUT: ${kept[*]}"
  return 0
}
