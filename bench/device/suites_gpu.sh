# bench/device.sh suites for the build, the machine, the GPU tests and the kernels (sourced).
# shellcheck shell=bash disable=SC2154  # here, suite, rows, W, K, BD: set by device.sh and lib.sh

suite_build() {
  # shellcheck disable=SC2046
  build kiln $(gpu_tests) && row "kiln + $(gpu_tests | wc -l) GPU test binaries" "ok ($BD)"
}

suite_probe() {
  {
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
    cmake --version | head -1
    nvcc --version | grep release
    g++ --version | head -1
    which ncu compute-sanitizer cuobjdump
  } >"$W/probe/toolchain.txt" 2>&1
  row "toolchain" "nvcc $(grep -m1 -oE 'release [0-9.]+' "$W/probe/toolchain.txt" || echo 'not found'); $(grep -m1 cmake "$W/probe/toolchain.txt")"
  need_gpu || return
  python3 "$here/ceilings.py" >"$W/probe/ceilings.txt" 2>&1
  row "ceilings (torch)" "rc=$? $(tr '\n' ' ' <"$W/probe/ceilings.txt" | cut -c1-200)"
}

suite_tests() {
  need_gpu || return
  local t
  # shellcheck disable=SC2046
  if ! build $(gpu_tests); then  # a test that does not compile must not hide the others: build them one by one
    for t in $(gpu_tests); do build "$t" >/dev/null 2>&1 || row "$t" "build FAILED: see build.log"; done
  fi
  for t in $(gpu_tests); do
    case $t in
      test_engine_demo) run_test "$t" --gtest_filter='EngineQwen3.Cuda*' ;;
      *) run_test "$t" ;;
    esac
  done
}

# KERNELS: the benchmarks of `kiln bench kernels` to run (exact names), default the ones docs/PERF.md cites.
suite_kernels() {
  need_gpu || return
  build kiln || return
  local b
  for b in ${KERNELS:-attention attention_cudnn attn_prep gemm gemv_attn_prep gemv_fp8 launch_floor}; do
    timeout 400 "$K" bench kernels --filter "=$b" >"$W/kernels/$b.txt" 2>&1
    row "bench kernels --filter =$b" "rc=$? ($(grep -c '^| ' "$W/kernels/$b.txt") table lines)"
  done
  grep -hE "^device|read stream|copy" "$W/kernels/attention.txt" 2>/dev/null | head -3
}

# VARIANTS="ENV=V ENV2=V;ENV=W": the attention tests (TEST_AB's filter) and rows again under each variant.
# ATTN_FILTER: the gtest filter of the default run; BENCH_KERNELS: the kernels' rows (default the defaults').
suite_attention() {
  need_gpu || return
  build kiln test_cuda_attention test_cuda_attention_early || return
  run_test test_cuda_attention ${ATTN_FILTER:+--gtest_filter=$ATTN_FILTER}
  run_test test_cuda_attention_early
  local v a=() variants=()
  IFS=';' read -r -a variants <<<"${VARIANTS:-}"
  for v in default "${variants[@]}"; do
    a=()
    [[ $v == default ]] || read -r -a a <<<"$v"
    if [[ $v != default ]]; then
      env "${a[@]}" timeout 300 "$BD/tests/test_cuda_attention" --gtest_brief=1 \
        --gtest_filter="${TEST_AB:-*PrefillV4*:*DecodeAndPrefill*:*MixedBatch*:*LargeBatch*}" \
        >"$W/attention/tests_${#rows[@]}.log" 2>&1
      row "tests [$v]" "rc=$? $(gtest_counts "$W/attention/tests_${#rows[@]}.log")"
    fi
    echo "==== [$v]" >>"$W/attention/bench.txt"
    env "${a[@]}" KILN_ATTN_BENCH_KERNELS="${BENCH_KERNELS:-decode v3,prefill v4}" timeout 300 \
      "$K" bench kernels --filter =attention >>"$W/attention/bench.txt" 2>&1
    row "bench kernels =attention [$v]" "rc=$?"
  done
  grep -E "^====|^\| attention|read stream" "$W/attention/bench.txt" | cut -c1-200
}

# SAN_FILTER: the attention cases (default three small grids that cover decode, prefill and fp8).
suite_sanitize() {
  need_gpu || return
  build test_cuda_attention test_attn_prep || return
  local tool
  for tool in memcheck racecheck synccheck; do
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 "$BD/tests/test_cuda_attention" --gtest_brief=1 \
      --gtest_filter="${SAN_FILTER:-CudaAttention.NhdAndHndBitwiseEqual:CudaAttention.MatchesCpuOracle:CudaAttention.Fp8SmallGridForSanitizers}" \
      >"$W/sanitize/attention_$tool.log" 2>&1
    row "attention $tool" "rc=$? $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$W/sanitize/attention_$tool.log")"
    KILN_ATTN_PREP_CASES=24 timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 "$BD/tests/test_attn_prep" \
      --gtest_brief=1 --gtest_filter='AttnPrepCuda.FusedEquals*:AttnPrepCuda.OutOfRange*:AttnPrepCuda.Graph*' \
      >"$W/sanitize/attn_prep_$tool.log" 2>&1
    row "attn_prep $tool" "rc=$? $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$W/sanitize/attn_prep_$tool.log")"
  done
}

# The attention kernels that miss their targets, one launch each under ncu, and the L2 sector table: a kernel
# that reads each byte once asks the L2 for dram_bytes / 32 sectors (docs/PERF.md, "Kernels").
# ncu-cmd: Nsight Compute on the launches of one kiln command whose kernel names match NCU_KERNEL (a regex),
# skipping NCU_SKIP of them (default 0) and profiling NCU_COUNT (default 4), with the ncu suite's sections (the
# pipe utilization in ComputeWorkloadAnalysis says whether a kernel is bound by an issue pipe, e.g. the
# conversions); NCU_CMD is the kiln command line without the binary, e.g. "bench model --shape qwen3-30b-a3b
# --quantization fp8 --context 1024 --steps 1 --batch 8 --no-breakdown". The report in ncu-cmd/report.txt.
# NCU_SOURCE=1 adds the warp-state samples by source line (SourceCounters, a sample every 32 cycles) and keeps
# them summed per CUDA line and per SASS instruction (bench/ncu_source_top.py) as ncu-cmd-source-{cuda,sass}.txt:
# where a latency-bound kernel's warps wait (the fused router's stalls at T = 1, docs/PERF.md E15).
suite_ncu_cmd() {
  need_gpu || return
  [[ -n ${NCU_KERNEL:-} && -n ${NCU_CMD:-} ]] || {
    row "ncu-cmd" "FAILED: set NCU_KERNEL and NCU_CMD"
    return 1
  }
  build kiln || return
  local cmd=() tune_args=()
  read -r -a cmd <<<"$NCU_CMD"
  # NCU_TUNE (e.g. "qwen3-30b-a3b --quantization fp8"): `kiln tune --shape` first, outside ncu: `kiln bench
  # model` tuning its GEMMs under ncu stopped on a launch error (cudaLaunchKernelEx: invalid argument; H100,
  # 2026-12-07), and with a tuned cache the same command ran (docs/PERF.md E15).
  if [[ -n ${NCU_TUNE:-} ]]; then
    read -r -a tune_args <<<"$NCU_TUNE"
    tune "${tune_args[0]}" 512 8 "${tune_args[@]:1}"
  fi
  local src_args=()
  [[ ${NCU_SOURCE:-0} == 1 ]] && src_args=(--section SourceCounters --warp-sampling-interval 0 -f
    -o "$W/ncu-cmd/source")
  timeout "${NCU_SECONDS:-300}" ncu --clock-control none -k "regex:$NCU_KERNEL" --launch-skip "${NCU_SKIP:-0}" \
    -c "${NCU_COUNT:-4}" --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section Occupancy --section WarpStateStats --section InstructionStats --section LaunchStats "${src_args[@]}" \
    "$K" "${cmd[@]}" >"$W/ncu-cmd/report.txt" 2>&1
  local rc=$?
  if ((${#src_args[@]})); then  # -o wrote the report file instead of printing it
    ncu -i "$W/ncu-cmd/source.ncu-rep" >"$W/ncu-cmd/report.txt" 2>&1
    local what
    for what in cuda sass; do
      ncu -i "$W/ncu-cmd/source.ncu-rep" --page source --csv --print-source "$what" \
        >"$W/ncu-cmd/source-$what.csv" 2>&1
      python3 bench/ncu_source_top.py "$W/ncu-cmd/source-$what.csv" 40 >"$W/ncu-cmd-source-$what.txt" 2>&1
      keep "$W/ncu-cmd-source-$what.txt"
    done
  fi
  row "ncu-cmd $NCU_KERNEL" "rc=$rc ($(grep -c '^  [a-z_].*(' "$W/ncu-cmd/report.txt") kernels profiled)"
  grep -E "^  [a-z_].*\(|Duration|Memory Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc A" \
    "$W/ncu-cmd/report.txt" | head -40
}

suite_ncu() {
  need_gpu || return
  build kiln || return
  # shellcheck disable=SC2054  # the commas are ncu's metric list
  local sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
    --section Occupancy --section WarpStateStats --section InstructionStats --section LaunchStats
    --metrics dram__bytes_read.sum,lts__t_sectors_srcunit_tex.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,lts__t_sectors_srcunit_ltcfabric.sum)
  local decode="B=128 ctx=9216 table=10240 32/8 D128 page32 HND"
  profile() {  # NAME KERNEL_REGEX BENCH_ONLY FILTER [LAUNCH_SKIP]
    KILN_ATTN_BENCH_ONLY="$3" timeout 200 ncu --clock-control none -k "regex:$2" --launch-skip "${5:-3}" -c 1 \
      "${sections[@]}" "$K" bench kernels --filter "$4" >"$W/ncu/$1.txt" 2>&1
    row "ncu $1" "rc=$?"
  }
  profile prefill prefill_sm90_kernel "ctx=4096 q_len=4096 table=5120 32/8 D128 page32 HND bf16" =attention
  profile decode_bf16 decode_sm90_kernel "$decode bf16" =attention
  profile decode_fp8 decode_sm90_kernel "$decode fp8" =attention
  profile cudnn_decode_bf16 "sdpa|fmha|flash|cudnn|fprop" "B=128 ctx=9216 32/8 D128 bf16 page32" =attention_cudnn 0
  local n
  printf '%-18s %10s %14s %14s %14s %14s\n' kernel "time us" "DRAM read GB" "L2 sectors" "of them misses" \
    "crossing" >"$W/ncu/l2_table.txt"
  for n in prefill decode_bf16 decode_fp8 cudnn_decode_bf16; do
    awk -v n="$n" '
      $1 == "Duration" { t = $3; if ($2 == "ms") t *= 1000 }
      $1 == "dram__bytes_read.sum" { g = $3; if ($2 == "Mbyte") g /= 1000 }
      $1 == "lts__t_sectors_srcunit_tex.sum" { s = $3 }
      $1 == "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum" { m = $3 }
      $1 == "lts__t_sectors_srcunit_ltcfabric.sum" { f = $3 }
      END { printf "%-18s %10s %14s %14s %14s %14s\n", n, t, g, s, m, f }' "$W/ncu/$n.txt" >>"$W/ncu/l2_table.txt"
  done
  cat "$W/ncu/l2_table.txt"
}

# The Hopper prefill kernel's SASS (no GPU needed, only a build): HGMMA / UTMALDG / USETMAXREG counts a
# head_dim unit, and the overlapped bf16 D128 kernel's waits, exponentials and barriers in order, run-length
# compressed: where ptxas put the P V wait (`DEPBAR.LE gsb0, 0x0`) against the softmax's MUFU.
suite_sass() {
  build kiln || return
  local d o
  for d in 64 128; do
    o=$(find "$BD" -name "attention_prefill_sm90_wgmma_d$d.cu.o" | head -1)
    [[ -n $o ]] || { row "d$d" "object not found"; continue; }
    cuobjdump --dump-sass "$o" >"$W/sass/sass_d$d.txt" 2>&1
    row "prefill sm90 D$d" "HGMMA $(grep -c HGMMA "$W/sass/sass_d$d.txt"), UTMALDG $(grep -c UTMALDG "$W/sass/sass_d$d.txt"), USETMAXREG $(grep -c USETMAXREG "$W/sass/sass_d$d.txt")"
  done
  o=$(find "$BD" -name "attention_prefill_sm90_wgmma_d128.cu.o" | head -1)
  [[ -n $o ]] || return
  # prefill_sm90::prefill_sm90_kernel<128, KvDtype::bf16, true>(PrefillSm90Params)
  local fun=_ZN4kiln4cuda12prefill_sm9019prefill_sm90_kernelILi128ELNS0_7KvDtypeE0ELb1EEEvNS0_17PrefillSm90ParamsE
  cuobjdump -sass -fun "$fun" "$o" |
    grep -E '^\s+/\*[0-9a-f]+\*/' | sed -E 's/^\s+\/\*[0-9a-f]+\*\/\s+//; s/ ;.*//' |
    awk '{ op = ($1 ~ /^@/) ? $2 : $1; split(op, a, "."); k = a[1]; n++
           if (op ~ /^WARPGROUP.DEPBAR/) t = $0
           else if (k == "HGMMA" || k == "MUFU" || k == "F2FP" || k == "SYNCS" || k == "BAR") t = k
           else next
           if (t == prev) { c++ } else { if (prev != "") printf "%s x%d\n", prev, c; prev = t; c = 1 } }
         END { if (prev != "") printf "%s x%d\n", prev, c; print "instructions", n }' >"$W/sass/order_d128.txt"
  row "D128 bf16 overlapped: sync order" "$(tail -1 "$W/sass/order_d128.txt") (sass/order_d128.txt)"
}
